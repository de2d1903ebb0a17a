"""An xDS client that never acknowledges: what a hung or refusing Envoy looks like to the controller.

    python -m rlcp.harness.silent_xds PORT [NODE]

It opens the same ADS stream an Envoy opens, subscribes to the default fleet's assignment, and
prints `received <version>` for each answer, flushed, without ever sending the ACK that would
follow. Its own process (as an Envoy is): the controller's server sees a peer, not a test double.
"""

from __future__ import annotations

import asyncio
import sys

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

EDS_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


async def listen(port: int, node: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
        await call.write(
            discovery_pb2.DiscoveryRequest(
                node=base_pb2.Node(id=node), type_url=EDS_TYPE, resource_names=["rl-default"]
            )
        )
        while (answer := await call.read()) is not grpc.aio.EOF:
            print(f"received {answer.version_info}", flush=True)


if __name__ == "__main__":
    asyncio.run(listen(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "silent"))

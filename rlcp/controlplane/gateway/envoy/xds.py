"""The controller's xDS server: each fleet's fence as an EDS cluster, over ADS (gRPC), to Envoy.

Why only EDS. The listener, the route and the clusters change with the settings alone, so they
sit in Envoy's bootstrap (`bootstrap.py`); what changes at the pace of training is which members
may serve and at which version, and that is one resource per fleet: its `ClusterLoadAssignment`.
One resource type, so one version and one ACK per Envoy say "it routes by this fence".

The protocol (state of the world, ADS): Envoy opens one stream and asks for its clusters'
assignments; every answer carries the fence's version and a nonce; Envoy's next request names
that nonce with the version it applied (an ACK) or an `error_detail` (a NACK). A request with
an older nonce is stale and only its subscription is read.

`publish()` (`fleet/publish.py`) recomputes the fence, sends it to every connected Envoy and
waits until each has ACKed that version, or `ack_timeout_s` passed: an update awaits it after
narrowing the fence and before pausing anyone. Envoys keep their last fence when the stream
breaks (a controller restarting); this server therefore answers nobody before its controllers
have read every member once (`fence.observed`), so a restart never sends an empty fence.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
import structlog
from envoy.config.core.v3 import address_pb2, base_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, struct_pb2

from rlcp.controlplane.fleet.publish import Published
from rlcp.controlplane.gateway.envoy.fence import METADATA_NAMESPACE, Cluster, fleet_cluster, observed
from rlcp.core.wire.controller.state import EnvoyPlaneView, EnvoyView, FleetState

EDS_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
log = structlog.get_logger("rlcp.controlplane.gateway.envoy")


def load_assignment(cluster: Cluster) -> endpoint_pb2.ClusterLoadAssignment:
    endpoints = []
    for e in cluster.endpoints:
        meta = struct_pb2.Struct()
        meta.update({"version": e.version, "worker": e.worker})
        endpoints.append(
            endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(
                    address=address_pb2.Address(
                        socket_address=address_pb2.SocketAddress(address=e.host, port_value=e.port)
                    )
                ),
                health_status=health_check_pb2.HEALTHY,
                metadata=base_pb2.Metadata(filter_metadata={METADATA_NAMESPACE: meta}),
            )
        )
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster.name, endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=endpoints)]
    )


@dataclass
class EnvoyStream:
    """One Envoy's ADS stream, and what it was sent and acknowledged."""

    node: str
    names: set[str] = field(default_factory=set)  # the cluster assignments it asked for
    subscribed: bool = False  # has asked for assignments at least once
    sent_version: str | None = None
    sent_nonce: str | None = None
    acked_version: str | None = None
    acked_at: datetime | None = None
    nacked: str | None = None
    connected: bool = True
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> EnvoyView:
        return EnvoyView(
            node=self.node,
            connected=self.connected,
            acked_version=self.acked_version,
            sent_version=self.sent_version,
            nacked=self.nacked,
            acked_at=self.acked_at,
        )


class XdsServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]  # generated servicer: untyped (Any)
    """ADS over the fleets' states: `states` gives each fleet's current document (base state)."""

    def __init__(
        self,
        *,
        states: Callable[[], Iterable[FleetState]],
        ack_timeout_s: float,
        on_ack: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._states, self.ack_timeout_s, self._on_ack, self._clock = states, ack_timeout_s, on_ack, clock
        self._boot = secrets.token_hex(3)  # versions from another run of the controller never compare equal
        self._serial = 0
        self.version = f"{self._boot}-0"
        self._serialized: dict[str, bytes] = {}
        self._assignments: dict[str, endpoint_pb2.ClusterLoadAssignment] = {}
        self.left_out: dict[str, str] = {}
        self.ready = False  # every fleet observed: answering may begin
        self._streams: dict[str, EnvoyStream] = {}  # by node id; a reconnect replaces the entry
        self._acked = asyncio.Event()  # set on every ACK or disconnect; waiters re-check
        self.url: str | None = None

    # -- the fence --------------------------------------------------------------------------
    def recompute(self) -> str:
        """The fence as the controllers see it now; a new version (and every stream woken) if it moved."""
        states = list(self._states())
        if not self.ready:
            if not all(observed(s) for s in states):
                return self.version
            self.ready = True
        clusters = [fleet_cluster(s) for s in states]
        assignments = {c.name: load_assignment(c) for c in clusters}
        serialized = {name: a.SerializeToString(deterministic=True) for name, a in assignments.items()}
        self.left_out = {worker: why for c in clusters for worker, why in c.left_out.items()}
        if serialized != self._serialized or self._serial == 0:
            self._serial += 1
            self.version = f"{self._boot}-{self._serial}"
            self._serialized, self._assignments = serialized, assignments
            log.info(
                "envoy_fence_changed",
                version=self.version,
                endpoints={c.name: [e.worker for e in c.endpoints] for c in clusters},
            )
            for stream in self._streams.values():
                stream.wake.set()
        return self.version

    def _pending(self, version: str) -> dict[str, str]:
        """Connected Envoys that have not ACKed `version`: node -> what they last did."""
        out = {}
        for s in self._streams.values():
            if s.connected and s.subscribed and s.acked_version != version:
                out[s.node] = (
                    f"refused it: {s.nacked}"
                    if s.nacked and s.sent_version == version
                    else f"last acknowledged {s.acked_version!r}"
                )
        return out

    async def publish(self) -> Published:
        start = self._clock()
        version = self.recompute()
        deadline = start + self.ack_timeout_s
        while self._pending(version) and (left := deadline - self._clock()) > 0:
            self._acked.clear()
            try:
                await asyncio.wait_for(self._acked.wait(), min(left, 0.25))
            except TimeoutError:
                version = self.recompute()  # not ready yet when first asked: may be now
        acked = sorted(
            s.node for s in self._streams.values() if s.connected and s.subscribed and s.acked_version == version
        )
        unacked = {node: f"{why} after {self.ack_timeout_s:g} s" for node, why in self._pending(version).items()}
        return Published(version=version, waited_s=self._clock() - start, acked=acked, unacked=unacked)

    def view(self) -> EnvoyPlaneView:
        return EnvoyPlaneView(
            xds_url=self.url,
            fence_version=self.version,
            ack_timeout_s=self.ack_timeout_s,
            envoys=[s.view() for s in sorted(self._streams.values(), key=lambda s: s.node)],
        )

    # -- the stream ---------------------------------------------------------------------------
    def _response(self, stream: EnvoyStream) -> discovery_pb2.DiscoveryResponse:
        resources = []
        for name in sorted(stream.names):
            assignment = self._assignments.get(name) or endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
            packed = any_pb2.Any()
            packed.Pack(assignment)
            resources.append(packed)
        stream.sent_version, stream.sent_nonce = self.version, secrets.token_hex(8)
        return discovery_pb2.DiscoveryResponse(
            version_info=self.version, resources=resources, type_url=EDS_TYPE, nonce=stream.sent_nonce
        )

    def _read(self, stream: EnvoyStream, request: Any) -> None:
        if request.type_url != EDS_TYPE:
            return  # the bootstrap subscribes to nothing else
        names = set(request.resource_names)
        if request.response_nonce and request.response_nonce != stream.sent_nonce:
            stale = names != stream.names  # an older answer's: only a new subscription counts
        else:
            stale = False
            if request.response_nonce:
                if request.HasField("error_detail"):
                    stream.nacked = request.error_detail.message
                    log.warning("envoy_nack", node=stream.node, version=stream.sent_version, error=stream.nacked)
                else:
                    stream.acked_version, stream.acked_at, stream.nacked = request.version_info, datetime.now(UTC), None
                self._acked.set()
                self._on_ack()
        if not stream.subscribed or names != stream.names or stale:
            stream.subscribed, stream.names = True, names
            stream.wake.set()

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[Any],  # noqa: N802 (gRPC's name)
        context: Any,
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        first = await anext(request_iterator, None)
        if first is None:
            return
        stream = EnvoyStream(node=first.node.id or context.peer())
        self._streams[stream.node] = stream
        log.info("envoy_connected", node=stream.node, peer=context.peer())

        async def read() -> None:
            self._read(stream, first)
            async for request in request_iterator:
                self._read(stream, request)

        reader = asyncio.create_task(read(), name=f"xds-read-{stream.node}")
        reader.add_done_callback(lambda _: stream.wake.set())
        try:
            while True:
                await stream.wake.wait()
                stream.wake.clear()
                if reader.done():
                    break
                if self.ready and stream.subscribed:
                    yield self._response(stream)
        finally:
            reader.cancel()
            stream.connected = False
            if self._streams.get(stream.node) is stream:
                self._acked.set()
                self._on_ack()
            log.info("envoy_disconnected", node=stream.node)


async def serve(server: XdsServer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server on `host:port` (0: a free port); answers it and the port bound."""
    grpc_server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(server, grpc_server)
    bound = grpc_server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"the xDS server could not bind {host}:{port}")
    await grpc_server.start()
    server.url = f"grpc://{host}:{bound}"
    return grpc_server, bound

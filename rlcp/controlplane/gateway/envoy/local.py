"""Envoy's control plane in the controller's process: the xDS server on the controller's loop,
fed by every fleet's state, in place of the Python gateway (`gateway.data_plane: envoy`).

A bump of any fleet's change counter wakes one named task that recomputes the fence (the
state document is rebuilt once per change, and the fence is read from it); an unchanged fence
sends nothing. Each fleet's controller gets `fence_sync` (operations await its ACKs before a
pause) and `envoy_view` (the `envoy` section of its state document); an ACK bumps the
counters, so the document shows it at once.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from rlcp.controlplane.fleets import Fleets
from rlcp.controlplane.gateway.envoy.xds import XdsServer, serve
from rlcp.controlplane.settings.gateway import EnvoySettings


class EnvoyPlane:
    def __init__(self, server: XdsServer, grpc_server: grpc.aio.Server, port: int, task: asyncio.Task[None]) -> None:
        self.server, self.port = server, port
        self._grpc, self._task = grpc_server, task

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._grpc.stop(grace=0.5)


async def follow_changes(server: XdsServer, changed: asyncio.Event) -> None:
    while True:
        await changed.wait()
        changed.clear()
        server.recompute()
        await asyncio.sleep(0.005)  # bumps in one burst (a status poll of every member): one recompute


async def start_envoy_plane(fleets: Fleets, settings: EnvoySettings) -> EnvoyPlane:
    every = list(fleets)

    def bump_all() -> None:
        for ctl in every:
            ctl.changes.bump()

    server = XdsServer(
        states=lambda: [ctl.base_state() for ctl in every], ack_timeout_s=settings.ack_timeout_s, on_ack=bump_all
    )
    changed = asyncio.Event()
    for ctl in every:
        ctl.changes.listeners.append(changed.set)
        ctl.fence_sync = server
        ctl.envoy_view = server.view
    grpc_server, port = await serve(server, settings.xds_host, settings.xds_port)
    server.recompute()
    task = asyncio.create_task(follow_changes(server, changed), name="envoy-xds-fence")
    return EnvoyPlane(server, grpc_server, port, task)

"""The gateway inside the controller process: its fleet state is the controller's own,
rebuilt only when the controller's change counter moved."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from rlcp.controlplane.controller import Controller
from rlcp.controlplane.gateway.app import start_site
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.gateway.routing import Router
from rlcp.controlplane.settings import GatewaySettings
from rlcp.core.wire.controller import FleetState


class ControllerState:
    def __init__(self, ctl: Controller) -> None:
        self._ctl = ctl

    def current(self) -> tuple[int, FleetState]:
        # The controller's own document without the gateway section (built from this), shared
        # with the state endpoint: one build per change serves both.
        return self._ctl.changes.generation, self._ctl.base_state()


async def start_local_gateway(ctl: Controller, settings: GatewaySettings, session: aiohttp.ClientSession, *,
                              admin_token: str | None = None) -> tuple[Gateway, web.AppRunner]:
    gateway = Gateway(router=Router(ControllerState(ctl)), session=session, settings=settings,
                      metrics=GatewayMetrics(), admin_token=admin_token)
    runner = await start_site(gateway)
    ctl.gateway_view = gateway.view
    gateway.on_circuit_change = ctl.changes.bump  # an ejection shows in the state document at once
    return gateway, runner

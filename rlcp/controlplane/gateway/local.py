"""The gateway inside the controller process: each fleet's state is its controller's own,
rebuilt only when that controller's change counter moved."""

from __future__ import annotations

from functools import partial

import aiohttp
from aiohttp import web

from rlcp.controlplane.controller import Controller
from rlcp.controlplane.fleets import Fleets
from rlcp.controlplane.gateway.app import start_site
from rlcp.controlplane.gateway.fleets import FleetRoute, ModelRoutes
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.gateway.routing import Router
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.handover import Peer
from rlcp.core.wire.controller.state import FleetState


class ControllerState:
    def __init__(self, ctl: Controller) -> None:
        self._ctl = ctl

    def current(self) -> tuple[int, FleetState]:
        # The controller's own document without the gateway section (built from this), shared
        # with the state endpoint: one build per change serves both.
        return self._ctl.changes.generation, self._ctl.base_state()


async def start_local_gateway(
    fleets: Fleets,
    settings: GatewaySettings,
    session: aiohttp.ClientSession,
    *,
    admin_token: str | None = None,
    controller: Peer | None = None,
) -> tuple[Gateway, web.AppRunner]:
    """The gateway on its own port; `controller`, the controller's application, answers what
    the gateway does not route (one URL)."""
    every = {ctl.fleet: FleetRoute(ctl.fleet, Router(ControllerState(ctl))) for ctl in fleets}
    default, named = every[fleets.default.fleet], [every[name] for name in fleets.named]
    gateway = Gateway(
        router=default.router,
        session=session,
        settings=settings,
        metrics=GatewayMetrics(),
        admin_token=admin_token,
        fleets=ModelRoutes(default, named) if named else None,
    )
    runner = await start_site(gateway, peer=controller)
    for ctl in fleets:
        ctl.gateway_view = partial(gateway.view, every[ctl.fleet].router)

    def circuit_changed() -> None:  # an ejection shows in the state documents at once
        for ctl in fleets:
            ctl.changes.bump()

    gateway.on_circuit_change = circuit_changed
    return gateway, runner

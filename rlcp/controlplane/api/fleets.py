"""The root's list of fleets (`GET /v1/rl/fleets`): one line per fleet, each fleet's whole API
served under its own path (`app.py`), so a trainer or rlctl finds where to point."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.controller import Controller
from rlcp.controlplane.fleetnames import fleet_path
from rlcp.controlplane.fleets import Fleets
from rlcp.core.http import json_response
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.state import FleetsListing, FleetSummary

FLEETS = web.AppKey("fleets", Fleets)
api = RouteTable()


def summary(ctl: Controller) -> FleetSummary:
    state = ctl.state()
    selector = ctl.fleet_settings.selector if ctl.fleet_settings is not None else None
    return FleetSummary(
        name=ctl.fleet,
        path=fleet_path(ctl.fleet),
        selector=selector,
        models=state.models,
        members=len(state.workers),
        serving=sum(w.serving for w in state.workers),
        phase=state.phase,
        pause_state=state.pause_state,
        desired_version=state.desired.weight_version,
        applied=state.applied,
    )


@api.get(
    "/v1/rl/fleets",
    "The fleets this controller keeps: the default one (served at the root) and each named "
    "one in settings `fleets` (served under its `path`), with members, versions and the models the gateway "
    "routes to it.",
    ok=FleetsListing,
    tag="fleet",
)
async def get_fleets(request: web.Request) -> web.Response:
    return json_response(FleetsListing(fleets=[summary(ctl) for ctl in request.app[FLEETS]]))

"""Placement (kind ray): how many agents the controller keeps as Ray actors, read and scaled."""

from __future__ import annotations

from rlcp.controlplane.api.handling import NATIVE, controller_of
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.errors import Conflict, InvalidInput
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.placement import PlacementRequest, PlacementView

api = RouteTable(tag=NATIVE, context=controller_of)


async def _placement(ctl: Controller, _: None) -> PlacementView:
    if ctl.placement is None:
        return PlacementView(kind="none", replicas=None, replicas_from=None, leading=ctl.leadership.is_leader)
    return ctl.placement.view(leading=ctl.leadership.is_leader)


async def _scale(ctl: Controller, body: PlacementRequest) -> PlacementView:
    if ctl.placement is None:
        raise Conflict("placement.kind is none: this controller places no agents, so there is nothing to scale")
    most = ctl.placement.settings.max_replicas
    if body.replicas is not None and body.replicas > most:
        raise InvalidInput(f"replicas {body.replicas} is above placement.ray.max_replicas ({most})", field="replicas")
    async with ctl.gate.api_operation("set_placement"):
        await ctl.desired.set_placement_replicas(body.replicas)
    ctl.placement.wake()
    return await _placement(ctl, None)


api.serve(
    "GET",
    "/v1/rl/placement",
    "The agents placement keeps (placement.kind ray): the count, where it comes from, "
    "and the actors and groups of the last pass.",
    _placement,
    ok=PlacementView,
)
api.serve(
    "PUT",
    "/v1/rl/placement",
    "Scale: set the count of agents to keep placed (kept in the desired state, so it "
    "outlives restarts; null hands it back to the settings). Answers once the count is stored; the placement "
    "loop acts at once, and the new agents join through discovery.",
    _scale,
    body=PlacementRequest,
    ok=PlacementView,
    errors=(409,),
)

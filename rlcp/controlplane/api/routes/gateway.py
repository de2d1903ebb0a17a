"""The gateway's staleness bound: which versions before the desired one its fence admits."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlcp.controlplane.api.handling import NATIVE, controller_of
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.updates import StalenessRequest

api = RouteTable(tag=NATIVE, context=controller_of)


class StalenessAnswer(BaseModel):
    staleness_bound: int
    allowed_versions: list[str] = Field(description="What the gateway's fence admits with it, desired first.")


async def _set_staleness(ctl: Controller, body: StalenessRequest) -> dict[str, object]:
    async with ctl.gate.api_operation("set_staleness"):
        await ctl.desired.set_staleness_bound(body.bound)
    d = ctl.desired.state
    return {
        "staleness_bound": d.staleness_bound,
        "allowed_versions": admitted_versions(d.weight_version, d.applied_versions, body.bound),
    }


api.serve(
    "POST",
    "/v1/rl/gateway/staleness",
    "Let the gateway route to members at one of the last `bound` versions "
    "before the desired one (kept in the desired state).",
    _set_staleness,
    body=StalenessRequest,
    ok=StalenessAnswer,
    errors=(409,),
)

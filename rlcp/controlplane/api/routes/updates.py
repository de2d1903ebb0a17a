"""The disk weight update (`POST /v1/rl/update_weights`): all at once or in rolling waves, waited for or followed."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.api.handling import NATIVE, PARTIAL, controller_of, operation, operation_response
from rlcp.controlplane.operations import weights
from rlcp.core.http import json_response, parse_body
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller import OperationResult, UpdateWeightsRequest

api = RouteTable(tag=NATIVE)


@operation(
    api,
    "POST",
    "/v1/rl/update_weights",
    "The update transaction: pause, load from disk, verify, resume -- all "
    "at once or in rolling waves. With `wait: false`, 202 with the running operation at once (its `Location` "
    "follows it).",
    body=UpdateWeightsRequest,
    errors=(403,),
    partial={**PARTIAL, 202: OperationResult},
)
async def post_update_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightsRequest)
    result = await weights.update_weights(controller_of(request), body)
    if not body.wait and result.status == "running":
        accepted = json_response(result, status=202)
        fleet_base = request.path[: request.path.rfind("/v1/rl/")]  # "" at the root, /fleets/<name> for a named fleet
        accepted.headers["Location"] = f"{fleet_base}/v1/rl/operations/{result.id}"
        return accepted
    return operation_response(result)

"""The guarded engine passthrough: one allowlisted engine route on the members it names."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.api.handling import NATIVE, controller_of, operation, operation_response
from rlcp.controlplane.operations import engine
from rlcp.core.http import parse_body
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.engine import EngineRouteRequest

api = RouteTable(tag=NATIVE)


@operation(
    api,
    "POST",
    "/v1/rl/engine/{route}",
    "Run one engine route from the allowlist (settings "
    "`engine_routes.allow`, per flavor) on one `worker`, the members a `selector` names, or the whole fleet; "
    "403 naming a route not allowed. Recorded as an operation; the touched workers are read again after it. "
    "When every member it reached refused it with a 4xx (a body the engine cannot read), that 4xx "
    "(`engine_rejected`, naming each worker, with the operation in `error.operation`); a 5xx or a lost "
    "connection is the fleet's failure (502).",
    body=EngineRouteRequest,
    body_optional=True,
    errors=(403, 404),
    path_params={"route": {"type": "string", "minLength": 1}},
)
async def post_engine_route(request: web.Request) -> web.Response:
    body = await parse_body(request, EngineRouteRequest, allow_empty=True)
    ctl = controller_of(request)
    return operation_response(
        await engine.run_engine_route(ctl, request.match_info["route"], body, ctl.settings.engine_routes.allow)
    )

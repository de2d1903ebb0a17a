"""Pause and resume the fleet, or the members a selector names."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.api.handling import controller_of, operation, operation_response
from rlcp.controlplane.operations import pause
from rlcp.core.http import parse_body
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.pause import PauseRequest, ResumeRequest

api = RouteTable()


@operation(
    api,
    "POST",
    "/v1/rl/pause",
    "Pause every member (with `selector`, only the matching members, held paused "
    "in the desired state); returns once quiesced or past the deadline.",
    body=PauseRequest,
    body_optional=True,
)
async def post_pause(request: web.Request) -> web.Response:
    body = await parse_body(request, PauseRequest, allow_empty=True)
    return operation_response(await pause.pause(controller_of(request), body))


@operation(
    api,
    "POST",
    "/v1/rl/resume",
    "Resume every member and release every hold (with `selector`, only the "
    "matching members; 409 while the whole fleet is paused).",
    body=ResumeRequest,
    body_optional=True,
)
async def post_resume(request: web.Request) -> web.Response:
    body = await parse_body(request, ResumeRequest, allow_empty=True)
    return operation_response(await pause.resume(controller_of(request), body))

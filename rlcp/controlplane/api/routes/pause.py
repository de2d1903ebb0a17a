"""Pause and resume the fleet, or the members a selector names."""

from __future__ import annotations

from rlcp.controlplane.api.handling import NATIVE, controller_of, serve_operation
from rlcp.controlplane.operations import pause
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.pause import PauseRequest, ResumeRequest

api = RouteTable(tag=NATIVE, context=controller_of)

serve_operation(
    api,
    "POST",
    "/v1/rl/pause",
    "Pause every member (with `selector`, only the matching members, held paused "
    "in the desired state); returns once quiesced or past the deadline.",
    pause.pause,
    body=PauseRequest,
    body_optional=True,
)
serve_operation(
    api,
    "POST",
    "/v1/rl/resume",
    "Resume every member and release every hold (with `selector`, only the "
    "matching members; 409 while the whole fleet is paused).",
    pause.resume,
    body=ResumeRequest,
    body_optional=True,
)

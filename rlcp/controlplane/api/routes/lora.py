"""LoRA adapters, loaded or hot-swapped and unloaded fleet-wide."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.api.handling import controller_of, operation, operation_response
from rlcp.controlplane.operations import lora
from rlcp.core.http import parse_body
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.lora import LoraRequest

api = RouteTable()


@operation(api, "POST", "/v1/rl/loras", "Load or hot-swap a LoRA adapter fleet-wide.", body=LoraRequest, errors=(403,))
async def post_lora(request: web.Request) -> web.Response:
    body = await parse_body(request, LoraRequest)
    return operation_response(await lora.load_lora(controller_of(request), body))


@operation(
    api,
    "DELETE",
    "/v1/rl/loras/{name}",
    "Unload an adapter everywhere (404 if the fleet has none of that name).",
    path_params={"name": {"type": "string", "minLength": 1}},
)
async def delete_lora(request: web.Request) -> web.Response:
    return operation_response(await lora.unload_lora(controller_of(request), request.match_info["name"]))

"""LoRA adapters, loaded or hot-swapped and unloaded fleet-wide."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.api.handling import NATIVE, controller_of, operation, operation_response, serve_operation
from rlcp.controlplane.operations import lora
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller.lora import LoraRequest

api = RouteTable(tag=NATIVE, context=controller_of)


serve_operation(
    api,
    "POST",
    "/v1/rl/loras",
    "Load or hot-swap a LoRA adapter fleet-wide.",
    lora.load_lora,
    body=LoraRequest,
    errors=(403,),
)


@operation(
    api,
    "DELETE",
    "/v1/rl/loras/{name}",
    "Unload an adapter everywhere (404 if the fleet has none of that name).",
    path_params={"name": {"type": "string", "minLength": 1}},
)
async def delete_lora(request: web.Request) -> web.Response:
    return operation_response(await lora.unload_lora(controller_of(request), request.match_info["name"]))

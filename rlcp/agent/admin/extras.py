"""Admin routes: this project's extras under /v1/agent, what a controller drives an agent with
beyond vLLM's RL routes (`routes.py`): the one read of its state, the disk update in one call
and in steps, the checksum check, adapters, and the fleet's desired version.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel

from rlcp.agent.admin.handling import ENGINE_ERRORS, agent_service
from rlcp.agent.operations.control import prepare as prepare_update
from rlcp.agent.operations.update import update_from_disk
from rlcp.agent.service import AgentService
from rlcp.core.http import json_response, parse_body
from rlcp.core.openapi import Handler, RouteTable
from rlcp.core.wire.agent import (
    AgentState,
    DesiredVersionRequest,
    DiskUpdatedAnswer,
    DiskUpdateRequest,
    LoraLoadedAnswer,
    LoraLoadRequest,
    PrepareRequest,
    UnloadedAnswer,
    WeightsCheckAnswer,
    WeightsCheckRequest,
    WeightsUpdatedAnswer,
    WeightsUpdateRequest,
    lora_checksum_key,
)

_EXTRA = "agent"
api = RouteTable(tag=_EXTRA)


B = TypeVar("B", bound=BaseModel)


def _loads(
    path: str, summary: str, *, body: type[B], ok: Any
) -> Callable[[Callable[[B, AgentService], Awaitable[web.Response]]], Handler]:
    """An extra route that takes a directory to load from and drives the engine with it: its JSON
    body parsed strictly (422 naming the field) before `operation(body, service)` runs; 403 for a
    directory outside the roots, 409 and 5xx from the engine. The disk load, the one-call update,
    prepare and the adapter load share this shape; only what they do differs."""

    def declare(operation: Callable[[B, AgentService], Awaitable[web.Response]]) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            return await operation(await parse_body(request, body), agent_service(request))

        return api.post(path, summary, body=body, ok=ok, errors=(403, *ENGINE_ERRORS))(handler)

    return declare


@api.get("/v1/agent/state", "Everything a controller needs from this agent, in one read.", ok=AgentState)
async def state(request: web.Request) -> web.Response:
    return json_response(agent_service(request).state())


@_loads(
    "/v1/agent/weights/disk",
    "Reload every weight from a safetensors directory and name them.",
    body=DiskUpdateRequest,
    ok=DiskUpdatedAnswer,
)
async def update_weights_from_disk(body: DiskUpdateRequest, service: AgentService) -> web.Response:
    checkpoint = await service.disk.check(body.path)
    await service.disk.load(checkpoint, body.version, reset_prefix_cache=body.reset_prefix_cache)
    checksums = await service.weights.checksums() if body.checksums else None
    return json_response({"status": "updated", "weight_version": service.weight_version, "checksums": checksums})


@api.post(
    "/v1/agent/weights/check",
    "Whether a disk load of this directory could start now (inside the roots, "
    "every file too; there; readable; holding the model's tensors). Reads headers only; touches no engine.",
    body=WeightsCheckRequest,
    ok=WeightsCheckAnswer,
    errors=(403,),
)
async def check_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, WeightsCheckRequest)
    if body.kind == "adapter":
        adapter = await agent_service(request).lora.check(body.path)
        return json_response({"path": str(adapter), "files": 0, "tensors": 0})
    checkpoint = await agent_service(request).disk.check(body.path)
    return json_response({"path": str(checkpoint.path), "files": checkpoint.files, "tensors": len(checkpoint.tensors)})


@_loads(
    "/v1/agent/weights/update",
    "A whole disk update in one call: check the checkpoint, learn the desired "
    "version, pause (unless paused), reload and name the weights, answer their checksums, and resume if told "
    "(only on agreement with `expected_checksums`, when given); answers the state.",
    body=WeightsUpdateRequest,
    ok=WeightsUpdatedAnswer,
)
async def update_weights_in_one_call(body: WeightsUpdateRequest, service: AgentService) -> web.Response:
    done = await update_from_disk(service.control, service.disk, service.weights, service.readiness, body)
    return json_response(
        WeightsUpdatedAnswer(
            status="updated",
            weight_version=service.weight_version,
            checksums=done.checksums,
            resumed=done.resumed,
            held_back=done.held_back,
            state=service.state(),
        )
    )


# The same update in three calls (prepare, the disk load with its checksums, resume), each
# answering what the controller would otherwise read in a call of its own: kept for clients
# that drive the steps themselves.
@_loads(
    "/v1/agent/prepare",
    "Learn the desired weight version, then pause; answers the state.",
    body=PrepareRequest,
    ok=AgentState,
)
async def prepare(body: PrepareRequest, service: AgentService) -> web.Response:
    await prepare_update(
        service.control,
        service.disk,
        service.readiness,
        body.desired_weight_version,
        body.mode,
        body.timeout_s,
        weights_path=body.weights_path,
    )
    return json_response(service.state())


@api.post("/v1/agent/resume", "Resume generation; answers the state.", ok=AgentState, errors=ENGINE_ERRORS)
async def resume_reporting(request: web.Request) -> web.Response:
    service = agent_service(request)
    await service.control.resume()
    return json_response(service.state())


@_loads(
    "/v1/agent/loras",
    "Load an adapter, or hot-swap the one under its name; with `checksums`, answers its checksums and the state too.",
    body=LoraLoadRequest,
    ok=LoraLoadedAnswer,
)
async def load_lora(body: LoraLoadRequest, service: AgentService) -> web.Response:
    info = await service.lora.load(body)
    if not body.checksums:
        return json_response(info)
    prefix = lora_checksum_key(body.name, "")
    held = {k: v for k, v in (await service.weights.checksums()).items() if k.startswith(prefix)}
    return json_response(LoraLoadedAnswer(**info.model_dump(), checksums=held, state=service.state()))


@api.delete(
    "/v1/agent/loras/{name}",
    "Remove an adapter from the engine (404 if none is loaded).",
    ok=UnloadedAnswer,
    errors=ENGINE_ERRORS,
    path_params={"name": {"type": "string", "minLength": 1}},
)
async def unload_lora(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    remaining = await agent_service(request).lora.unload(name)
    return json_response({"status": "unloaded", "name": name, "engine_adapter_ids": sorted(remaining)})


@api.put(
    "/v1/agent/desired",
    "The fleet's desired weight version (readiness follows it).",
    body=DesiredVersionRequest,
    ok=AgentState,
)
async def set_desired(request: web.Request) -> web.Response:
    body = await parse_body(request, DesiredVersionRequest)
    service = agent_service(request)
    service.readiness.set_desired_version(body.weight_version)
    return json_response(service.state())

"""Admin routes: this project's extras under /v1/agent, what a controller drives an agent with
beyond vLLM's RL routes (`routes.py`): the one read of its state, the disk update in one call
and in steps, the checksum check, adapters, and the fleet's desired version. Each route names the
function it runs on the service (`handling.serve` parses what the route declares and answers
its value as JSON); the table is at the end, in the order the routes are registered.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rlcp.agent.admin.handling import ENGINE_ERRORS, agent_service
from rlcp.agent.operations.control import prepare as prepare_update
from rlcp.agent.operations.update import update_from_disk
from rlcp.agent.service import AgentService
from rlcp.core.http import json_response
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.agent import (
    AgentState,
    DesiredVersionRequest,
    DiskUpdatedAnswer,
    DiskUpdateRequest,
    LoraInfo,
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
api = RouteTable(tag=_EXTRA, context=agent_service)
# A load: a directory to load from, checked against the roots (403 outside them), then the engine
# driven with it (409 and 5xx from the engine).
_LOAD_ERRORS = (403, *ENGINE_ERRORS)


async def _state(service: AgentService, _: None) -> AgentState:
    return service.state()


async def update_weights_from_disk(service: AgentService, body: DiskUpdateRequest) -> dict[str, Any]:
    checkpoint = await service.disk.check(body.path)
    await service.disk.load(checkpoint, body.version, reset_prefix_cache=body.reset_prefix_cache)
    checksums = await service.weights.checksums() if body.checksums else None
    return {"status": "updated", "weight_version": service.weight_version, "checksums": checksums}


async def check_weights(service: AgentService, body: WeightsCheckRequest) -> dict[str, Any]:
    if body.kind == "adapter":
        adapter = await service.lora.check(body.path)
        return {"path": str(adapter), "files": 0, "tensors": 0}
    checkpoint = await service.disk.check(body.path)
    return {"path": str(checkpoint.path), "files": checkpoint.files, "tensors": len(checkpoint.tensors)}


async def update_weights_in_one_call(service: AgentService, body: WeightsUpdateRequest) -> WeightsUpdatedAnswer:
    done = await update_from_disk(service.control, service.disk, service.weights, service.readiness, body)
    return WeightsUpdatedAnswer(
        status="updated",
        weight_version=service.weight_version,
        checksums=done.checksums,
        resumed=done.resumed,
        held_back=done.held_back,
        state=service.state(),
    )


# The same update in three calls (prepare, the disk load with its checksums, resume), each
# answering what the controller would otherwise read in a call of its own: kept for clients
# that drive the steps themselves.
async def prepare(service: AgentService, body: PrepareRequest) -> AgentState:
    await prepare_update(
        service.control,
        service.disk,
        service.readiness,
        body.desired_weight_version,
        body.mode,
        body.timeout_s,
        weights_path=body.weights_path,
    )
    return service.state()


async def resume_reporting(service: AgentService, _: None) -> AgentState:
    await service.control.resume()
    return service.state()


async def load_lora(service: AgentService, body: LoraLoadRequest) -> LoraInfo | LoraLoadedAnswer:
    info = await service.lora.load(body)
    if not body.checksums:
        return info
    prefix = lora_checksum_key(body.name, "")
    held = {k: v for k, v in (await service.weights.checksums()).items() if k.startswith(prefix)}
    return LoraLoadedAnswer(**info.model_dump(), checksums=held, state=service.state())


async def unload_lora(request: web.Request) -> web.Response:
    name = request.match_info["name"]  # the path names it: a handler of its own
    remaining = await agent_service(request).lora.unload(name)
    return json_response({"status": "unloaded", "name": name, "engine_adapter_ids": sorted(remaining)})


async def set_desired(service: AgentService, body: DesiredVersionRequest) -> AgentState:
    service.readiness.set_desired_version(body.weight_version)
    return service.state()


# The routes, in the order they are registered and documented.
api.serve(
    "GET", "/v1/agent/state", "Everything a controller needs from this agent, in one read.", _state, ok=AgentState
)
api.serve(
    "POST",
    "/v1/agent/weights/disk",
    "Reload every weight from a safetensors directory and name them.",
    update_weights_from_disk,
    body=DiskUpdateRequest,
    ok=DiskUpdatedAnswer,
    errors=_LOAD_ERRORS,
)
api.serve(
    "POST",
    "/v1/agent/weights/check",
    "Whether a disk load of this directory could start now (inside the roots, "
    "every file too; there; readable; holding the model's tensors). Reads headers only; touches no engine.",
    check_weights,
    body=WeightsCheckRequest,
    ok=WeightsCheckAnswer,
    errors=(403,),
)
api.serve(
    "POST",
    "/v1/agent/weights/update",
    "A whole disk update in one call: check the checkpoint, learn the desired "
    "version, pause (unless paused), reload and name the weights, answer their checksums, and resume if told "
    "(only on agreement with `expected_checksums`, when given); answers the state.",
    update_weights_in_one_call,
    body=WeightsUpdateRequest,
    ok=WeightsUpdatedAnswer,
    errors=_LOAD_ERRORS,
)
api.serve(
    "POST",
    "/v1/agent/prepare",
    "Learn the desired weight version, then pause; answers the state.",
    prepare,
    body=PrepareRequest,
    ok=AgentState,
    errors=_LOAD_ERRORS,
)
api.serve(
    "POST",
    "/v1/agent/resume",
    "Resume generation; answers the state.",
    resume_reporting,
    ok=AgentState,
    errors=ENGINE_ERRORS,
)
api.serve(
    "POST",
    "/v1/agent/loras",
    "Load an adapter, or hot-swap the one under its name; with `checksums`, answers its checksums and the state too.",
    load_lora,
    body=LoraLoadRequest,
    ok=LoraLoadedAnswer,
    errors=_LOAD_ERRORS,
)
api.delete(
    "/v1/agent/loras/{name}",
    "Remove an adapter from the engine (404 if none is loaded).",
    ok=UnloadedAnswer,
    errors=ENGINE_ERRORS,
    path_params={"name": {"type": "string", "minLength": 1}},
)(unload_lora)
api.serve(
    "PUT",
    "/v1/agent/desired",
    "The fleet's desired weight version (readiness follows it).",
    set_desired,
    body=DesiredVersionRequest,
    ok=AgentState,
)

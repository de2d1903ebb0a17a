"""Admin routes: vLLM's RL route shapes at the root, this project's extras under /v1/agent.

The root routes take and return exactly what `vllm/entrypoints/rl/online/api_router.py`
does, so a client written for a vLLM RL server works against one agent. Handlers parse,
call the operation (`rlcp/agent/operations/`, reached through the `AgentService`), and shape
the answer; the operations decide everything else.

Each route is declared once, on its handler (`rlcp.core.openapi.RouteTable`): the app factory
registers the handlers from `api`, and `rlcp.agent.admin.openapi` builds the document from the
same declarations. Request models are the wire models the handlers parse; the small answers,
which the handlers build as dicts, are described by models in `rlcp.core.wire.agent` too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel

from rlcp.agent.operations.control import prepare as prepare_update
from rlcp.agent.operations.update import update_from_disk
from rlcp.agent.service import AgentService
from rlcp.core.errors import ValidationFailedError
from rlcp.core.http import json_response, parse_body, validate
from rlcp.core.openapi import Handler, RouteTable
from rlcp.core.wire.agent import (
    AbortedAnswer,
    AbortRequestsRequest,
    AgentState,
    ChecksumsAnswer,
    CompareAnswer,
    DesiredVersionRequest,
    DiskUpdatedAnswer,
    DiskUpdateRequest,
    FinishWeightUpdateRequest,
    InitWeightTransferRequest,
    IsPausedAnswer,
    IsSleepingAnswer,
    LoraLoadedAnswer,
    LoraLoadRequest,
    MessageAnswer,
    PauseQuery,
    PrepareRequest,
    ProbeAnswer,
    ResetPrefixCacheAnswer,
    ResetPrefixCacheQuery,
    SleepAnswer,
    SleepQuery,
    StatusAnswer,
    UnloadedAnswer,
    UpdateWeightVersionRequest,
    VersionSetAnswer,
    WakeUpAnswer,
    WakeUpQuery,
    WeightCheckerRequest,
    WeightInfoAnswer,
    WeightsCheckAnswer,
    WeightsCheckRequest,
    WeightsUpdatedAnswer,
    WeightsUpdateRequest,
    WeightTransferUpdateRequest,
    WorldSizeAnswer,
    WorldSizeQuery,
    lora_checksum_key,
)
from rlcp.core.wire.server_info import ServerInfoAnswer, ServerInfoQuery

SERVICE = web.AppKey("service", AgentService)
api = RouteTable()

# The engine answers every primitive under a deadline: 502 it failed, 503 it is dead, 504 too slow;
# 409 another mutating operation is running.
_ENGINE = (409, 502, 503, 504)
_VLLM, _EXTRA, _PROBES = "vLLM RL routes", "agent", "probes"


def _service(request: web.Request) -> AgentService:
    return request.app[SERVICE]


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
            return await operation(await parse_body(request, body), _service(request))

        return api.post(path, summary, body=body, ok=ok, errors=(403, *_ENGINE), tag=_EXTRA)(handler)

    return declare


# -- vLLM RL route shapes ------------------------------------------------------------
@api.post(
    "/pause",
    "Pause generation: abort, wait (drain) or keep (freeze) in-flight requests.",
    query=PauseQuery,
    ok=StatusAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def pause(request: web.Request) -> web.Response:
    query = validate(PauseQuery, dict(request.query))
    await _service(request).control.pause(query.mode, query.timeout_s)
    return json_response({"status": "paused"})


@api.post("/resume", "Resume generation; frozen requests continue.", ok=StatusAnswer, errors=_ENGINE, tag=_VLLM)
async def resume(request: web.Request) -> web.Response:
    await _service(request).control.resume()
    return json_response({"status": "resumed"})


@api.get("/is_paused", "Whether generation is paused.", ok=IsPausedAnswer, tag=_VLLM)
async def is_paused(request: web.Request) -> web.Response:
    return json_response({"is_paused": _service(request).paused})


@api.post(
    "/sleep",
    "Sleep (vLLM's dev route): pause (`mode`), then release memory -- level 1 offloads the weights "
    "and drops the KV cache, level 2 discards both. Until woken, only pause, abort and wake_up are taken "
    "(409 otherwise) and the agent reports not ready. vLLM's CPU build pauses and ignores the rest.",
    query=SleepQuery,
    ok=SleepAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def sleep(request: web.Request) -> web.Response:
    query = validate(SleepQuery, dict(request.query))
    await _service(request).control.sleep(query.level, query.mode, query.timeout_s)
    return json_response({"status": "sleeping", "level": query.level})


@api.post(
    "/wake_up",
    "Wake up (vLLM's dev route): every allocation, or the `tags` named; once fully awake the engine schedules again.",
    query=WakeUpQuery,
    ok=WakeUpAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def wake_up(request: web.Request) -> web.Response:
    query = validate(WakeUpQuery, {"tags": request.query.getall("tags", [])})
    tags: list[str] | None = list(query.tags) or None
    fully_awake = await _service(request).control.wake_up(tags)
    return json_response({"status": "awake" if fully_awake else "sleeping", "tags": tags})


@api.get(
    "/is_sleeping",
    "Whether the engine is asleep (its memory released; a mere pause is not sleep).",
    ok=IsSleepingAnswer,
    tag=_VLLM,
)
async def is_sleeping(request: web.Request) -> web.Response:
    return json_response({"is_sleeping": _service(request).control.sleeping})


@api.post(
    "/reset_prefix_cache",
    "Drop the prefix cache (vLLM's dev route): `success` false while requests hold "
    "blocks and `reset_running_requests` was not given. Refused while asleep (409).",
    query=ResetPrefixCacheQuery,
    ok=ResetPrefixCacheAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def reset_prefix_cache(request: web.Request) -> web.Response:
    query = validate(ResetPrefixCacheQuery, dict(request.query))
    done = await _service(request).caches.reset_prefix_cache(
        running=query.reset_running_requests, external=query.reset_external
    )
    return json_response({"success": done})


@api.post(
    "/abort_requests",
    "Abort the named requests, or all of them.",
    body=AbortRequestsRequest,
    body_optional=True,
    ok=AbortedAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def abort_requests(request: web.Request) -> web.Response:
    body = await parse_body(request, AbortRequestsRequest, allow_empty=True)
    aborted = await _service(request).control.abort_requests(body.request_ids or None)
    return json_response({"status": "aborted", "aborted": aborted})


@api.post(
    "/init_weight_transfer_engine",
    "Join the trainer's weight-transfer group.",
    body=InitWeightTransferRequest,
    ok=MessageAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def init_weight_transfer_engine(request: web.Request) -> web.Response:
    body = await parse_body(request, InitWeightTransferRequest)
    await _service(request).transfer.init(body.init_info)
    return json_response({"message": "Weight transfer initialized"})


@api.post("/start_weight_update", "Open a weight update.", ok=MessageAnswer, errors=_ENGINE, tag=_VLLM)
async def start_weight_update(request: web.Request) -> web.Response:
    await _service(request).transfer.start()
    return json_response({"message": "Weight update started"})


@api.post(
    "/update_weights",
    "Receive one update chunk (or a list) over the group.",
    body=WeightTransferUpdateRequest,
    ok=MessageAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def update_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, WeightTransferUpdateRequest)
    await _service(request).transfer.update(body.update_info)
    return json_response({"message": "Weights updated"})


@api.post(
    "/finish_weight_update",
    "Close the update; name the weights; drop the prefix cache.",
    body=FinishWeightUpdateRequest,
    body_optional=True,
    ok=MessageAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def finish_weight_update(request: web.Request) -> web.Response:
    body = await parse_body(request, FinishWeightUpdateRequest, allow_empty=True)
    await _service(request).transfer.finish(body.weight_version)
    return json_response({"message": "Weight update finished"})


@api.post(
    "/shutdown_weight_transfer_engine", "Leave the weight-transfer group.", ok=MessageAnswer, errors=_ENGINE, tag=_VLLM
)
async def shutdown_weight_transfer_engine(request: web.Request) -> web.Response:
    await _service(request).transfer.shutdown()
    return json_response({"message": "Weight transfer shut down"})


@api.post(
    "/update_weight_version",
    "Name the weights the engine holds.",
    body=UpdateWeightVersionRequest,
    ok=VersionSetAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def update_weight_version(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightVersionRequest)
    await _service(request).weights.set_version(body.new_version)
    return json_response({"success": True, "new_version": body.new_version})


@api.get("/weight_info", "The weight version.", ok=WeightInfoAnswer, tag=_VLLM)
async def weight_info(request: web.Request) -> web.Response:
    return json_response({"weight_version": _service(request).weight_version})


@api.get("/get_world_size", "Inference ranks behind this engine.", query=WorldSizeQuery, ok=WorldSizeAnswer, tag=_VLLM)
async def get_world_size(request: web.Request) -> web.Response:
    query = validate(WorldSizeQuery, dict(request.query))
    return json_response({"world_size": _service(request).engine.world_size(query.include_dp)})


@api.get(
    "/server_info",
    "The engine's resolved configuration, as vLLM's dev route answers it: `vllm_config` a JSON tree "
    "(`?config_format=json`) or vLLM's text form (the default). `vllm_env` and `system_env` are "
    "left empty: the engine host's environment is not the admin API's to publish.",
    query=ServerInfoQuery,
    ok=ServerInfoAnswer,
    tag=_VLLM,
)
async def server_info(request: web.Request) -> web.Response:
    query = validate(ServerInfoQuery, dict(request.query))
    config = _service(request).engine.server_config(query.config_format)
    return json_response({"vllm_config": config, "vllm_env": {}, "system_env": {}})


@api.post(
    "/weight_checker",
    "Weight checksums (the base weights and the adapters held): compute, reset (base "
    "weights), or compare with a baseline.",
    body=WeightCheckerRequest,
    ok=StatusAnswer | ChecksumsAnswer | CompareAnswer,
    errors=_ENGINE,
    tag=_VLLM,
)
async def weight_checker(request: web.Request) -> web.Response:
    body = await parse_body(request, WeightCheckerRequest)
    service = _service(request)
    if body.action == "reset":
        await service.weights.reset_checker()
        return json_response({"status": "reset"})
    if body.action == "compare" and body.baseline is None:
        raise ValidationFailedError("action='compare' requires a 'baseline' object", field="baseline")
    checksums = await service.weights.checksums()
    if body.action == "checksum":
        return json_response({"checksums": checksums})
    assert body.baseline is not None
    mismatches = sorted(k for k in checksums.keys() | body.baseline.keys() if checksums.get(k) != body.baseline.get(k))
    return json_response({"match": not mismatches, "mismatches": mismatches})


# -- this project's extras -------------------------------------------------------------
@api.get("/v1/agent/state", "Everything a controller needs from this agent, in one read.", ok=AgentState, tag=_EXTRA)
async def state(request: web.Request) -> web.Response:
    return json_response(_service(request).state())


@_loads(
    "/v1/agent/weights/disk",
    "Reload every weight from a safetensors directory and name them.",
    body=DiskUpdateRequest,
    ok=DiskUpdatedAnswer,
)
async def update_weights_from_disk(body: DiskUpdateRequest, service: AgentService) -> web.Response:
    await service.disk.load(body)
    checksums = await service.weights.checksums() if body.checksums else None
    return json_response({"status": "updated", "weight_version": service.weight_version, "checksums": checksums})


@api.post(
    "/v1/agent/weights/check",
    "Whether a disk load of this directory could start now (inside the roots, "
    "every file too; there; readable; holding the model's tensors). Reads headers only; touches no engine.",
    body=WeightsCheckRequest,
    ok=WeightsCheckAnswer,
    errors=(403,),
    tag=_EXTRA,
)
async def check_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, WeightsCheckRequest)
    if body.kind == "adapter":
        adapter = await _service(request).lora.check(body.path)
        return json_response({"path": str(adapter), "files": 0, "tensors": 0})
    path, summary = await _service(request).disk.check(body.path)
    return json_response({"path": str(path), "files": summary.files, "tensors": len(summary.tensors)})


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


@api.post("/v1/agent/resume", "Resume generation; answers the state.", ok=AgentState, errors=_ENGINE, tag=_EXTRA)
async def resume_reporting(request: web.Request) -> web.Response:
    service = _service(request)
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
    errors=_ENGINE,
    path_params={"name": {"type": "string", "minLength": 1}},
    tag=_EXTRA,
)
async def unload_lora(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    remaining = await _service(request).lora.unload(name)
    return json_response({"status": "unloaded", "name": name, "engine_adapter_ids": sorted(remaining)})


@api.put(
    "/v1/agent/desired",
    "The fleet's desired weight version (readiness follows it).",
    body=DesiredVersionRequest,
    ok=AgentState,
    tag=_EXTRA,
)
async def set_desired(request: web.Request) -> web.Response:
    body = await parse_body(request, DesiredVersionRequest)
    service = _service(request)
    service.readiness.set_desired_version(body.weight_version)
    return json_response(service.state())


@api.get(
    "/healthz",
    "Liveness: 200 while the engine is alive.",
    ok=ProbeAnswer,
    answers={503: ProbeAnswer},
    probe=True,
    tag=_PROBES,
)
async def healthz(request: web.Request) -> web.Response:
    service = _service(request)
    alive = service.engine.is_alive()
    return json_response({"status": "ok" if alive else "engine_dead"}, status=200 if alive else 503)


@api.get(
    "/readyz",
    "Readiness: 503 with the reason while not ready.",
    ok=ProbeAnswer,
    answers={503: ProbeAnswer},
    probe=True,
    tag=_PROBES,
)
async def readyz(request: web.Request) -> web.Response:
    reason = _service(request).readiness.not_ready_reason()
    if reason is None:
        return json_response({"status": "ready"})
    return json_response({"status": "not_ready", "reason": reason}, status=503)


@api.get("/metrics", "Prometheus metrics.", ok=str, media_type="text/plain", tag=_PROBES)
async def metrics(request: web.Request) -> web.Response:
    service = _service(request)
    body = service.metrics.render(
        paused=service.paused, ready=service.not_ready_reason() is None, requests=service.engine.request_counts()
    )
    return web.Response(body=body, content_type="text/plain", charset="utf-8")

"""Admin routes: vLLM's RL route shapes at the root.

The root routes take and return exactly what `vllm/entrypoints/rl/online/api_router.py`
does, so a client written for a vLLM RL server works against one agent. Handlers parse,
call the operation (`rlcp/agent/operations/`, reached through the `AgentService`), and shape
the answer; the operations decide everything else. This project's extras under /v1/agent are
in `extras.py`, the probes in `probes.py`, what they all share in `handling.py`.

Each route is declared once, on its handler (`rlcp.core.openapi.RouteTable`): the app factory
registers the handlers from each module's `api`, and `rlcp.agent.admin.openapi` builds the
document from the same declarations. Request models are the wire models the handlers parse; the
small answers, which the handlers build as dicts, are described by models in `rlcp.core.wire.agent` too.
"""

from __future__ import annotations

from aiohttp import web

from rlcp.agent.admin.handling import ENGINE_ERRORS, agent_service
from rlcp.core.errors import ValidationFailedError
from rlcp.core.http import json_response, parse_body, validate
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.agent import (
    AbortedAnswer,
    AbortRequestsRequest,
    ChecksumsAnswer,
    CompareAnswer,
    FinishWeightUpdateRequest,
    InitWeightTransferRequest,
    IsPausedAnswer,
    IsSleepingAnswer,
    MessageAnswer,
    PauseQuery,
    ResetPrefixCacheAnswer,
    ResetPrefixCacheQuery,
    SleepAnswer,
    SleepQuery,
    StatusAnswer,
    UpdateWeightVersionRequest,
    VersionSetAnswer,
    WakeUpAnswer,
    WakeUpQuery,
    WeightCheckerRequest,
    WeightInfoAnswer,
    WeightTransferUpdateRequest,
    WorldSizeAnswer,
    WorldSizeQuery,
)
from rlcp.core.wire.server_info import ServerInfoAnswer, ServerInfoQuery

api = RouteTable()
_VLLM = "vLLM RL routes"


@api.post(
    "/pause",
    "Pause generation: abort, wait (drain) or keep (freeze) in-flight requests.",
    query=PauseQuery,
    ok=StatusAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def pause(request: web.Request) -> web.Response:
    query = validate(PauseQuery, dict(request.query))
    await agent_service(request).control.pause(query.mode, query.timeout_s)
    return json_response({"status": "paused"})


@api.post("/resume", "Resume generation; frozen requests continue.", ok=StatusAnswer, errors=ENGINE_ERRORS, tag=_VLLM)
async def resume(request: web.Request) -> web.Response:
    await agent_service(request).control.resume()
    return json_response({"status": "resumed"})


@api.get("/is_paused", "Whether generation is paused.", ok=IsPausedAnswer, tag=_VLLM)
async def is_paused(request: web.Request) -> web.Response:
    return json_response({"is_paused": agent_service(request).paused})


@api.post(
    "/sleep",
    "Sleep (vLLM's dev route): pause (`mode`), then release memory -- level 1 offloads the weights "
    "and drops the KV cache, level 2 discards both. Until woken, only pause, abort and wake_up are taken "
    "(409 otherwise) and the agent reports not ready. vLLM's CPU build pauses and ignores the rest.",
    query=SleepQuery,
    ok=SleepAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def sleep(request: web.Request) -> web.Response:
    query = validate(SleepQuery, dict(request.query))
    await agent_service(request).control.sleep(query.level, query.mode, query.timeout_s)
    return json_response({"status": "sleeping", "level": query.level})


@api.post(
    "/wake_up",
    "Wake up (vLLM's dev route): every allocation, or the `tags` named; once fully awake the engine schedules again.",
    query=WakeUpQuery,
    ok=WakeUpAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def wake_up(request: web.Request) -> web.Response:
    query = validate(WakeUpQuery, {"tags": request.query.getall("tags", [])})
    tags: list[str] | None = list(query.tags) or None
    fully_awake = await agent_service(request).control.wake_up(tags)
    return json_response({"status": "awake" if fully_awake else "sleeping", "tags": tags})


@api.get(
    "/is_sleeping",
    "Whether the engine is asleep (its memory released; a mere pause is not sleep).",
    ok=IsSleepingAnswer,
    tag=_VLLM,
)
async def is_sleeping(request: web.Request) -> web.Response:
    return json_response({"is_sleeping": agent_service(request).control.sleeping})


@api.post(
    "/reset_prefix_cache",
    "Drop the prefix cache (vLLM's dev route): `success` false while requests hold "
    "blocks and `reset_running_requests` was not given. Refused while asleep (409).",
    query=ResetPrefixCacheQuery,
    ok=ResetPrefixCacheAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def reset_prefix_cache(request: web.Request) -> web.Response:
    query = validate(ResetPrefixCacheQuery, dict(request.query))
    done = await agent_service(request).caches.reset_prefix_cache(
        running=query.reset_running_requests, external=query.reset_external
    )
    return json_response({"success": done})


@api.post(
    "/abort_requests",
    "Abort the named requests, or all of them.",
    body=AbortRequestsRequest,
    body_optional=True,
    ok=AbortedAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def abort_requests(request: web.Request) -> web.Response:
    body = await parse_body(request, AbortRequestsRequest, allow_empty=True)
    aborted = await agent_service(request).control.abort_requests(body.request_ids or None)
    return json_response({"status": "aborted", "aborted": aborted})


@api.post(
    "/init_weight_transfer_engine",
    "Join the trainer's weight-transfer group.",
    body=InitWeightTransferRequest,
    ok=MessageAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def init_weight_transfer_engine(request: web.Request) -> web.Response:
    body = await parse_body(request, InitWeightTransferRequest)
    await agent_service(request).transfer.init(body.init_info)
    return json_response({"message": "Weight transfer initialized"})


@api.post("/start_weight_update", "Open a weight update.", ok=MessageAnswer, errors=ENGINE_ERRORS, tag=_VLLM)
async def start_weight_update(request: web.Request) -> web.Response:
    await agent_service(request).transfer.start()
    return json_response({"message": "Weight update started"})


@api.post(
    "/update_weights",
    "Receive one update chunk (or a list) over the group.",
    body=WeightTransferUpdateRequest,
    ok=MessageAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def update_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, WeightTransferUpdateRequest)
    await agent_service(request).transfer.update(body.update_info)
    return json_response({"message": "Weights updated"})


@api.post(
    "/finish_weight_update",
    "Close the update; name the weights; drop the prefix cache.",
    body=FinishWeightUpdateRequest,
    body_optional=True,
    ok=MessageAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def finish_weight_update(request: web.Request) -> web.Response:
    body = await parse_body(request, FinishWeightUpdateRequest, allow_empty=True)
    await agent_service(request).transfer.finish(body.weight_version)
    return json_response({"message": "Weight update finished"})


@api.post(
    "/shutdown_weight_transfer_engine",
    "Leave the weight-transfer group.",
    ok=MessageAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def shutdown_weight_transfer_engine(request: web.Request) -> web.Response:
    await agent_service(request).transfer.shutdown()
    return json_response({"message": "Weight transfer shut down"})


@api.post(
    "/update_weight_version",
    "Name the weights the engine holds.",
    body=UpdateWeightVersionRequest,
    ok=VersionSetAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def update_weight_version(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightVersionRequest)
    await agent_service(request).weights.set_version(body.new_version)
    return json_response({"success": True, "new_version": body.new_version})


@api.get("/weight_info", "The weight version.", ok=WeightInfoAnswer, tag=_VLLM)
async def weight_info(request: web.Request) -> web.Response:
    return json_response({"weight_version": agent_service(request).weight_version})


@api.get("/get_world_size", "Inference ranks behind this engine.", query=WorldSizeQuery, ok=WorldSizeAnswer, tag=_VLLM)
async def get_world_size(request: web.Request) -> web.Response:
    query = validate(WorldSizeQuery, dict(request.query))
    return json_response({"world_size": agent_service(request).engine.world_size(query.include_dp)})


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
    config = agent_service(request).engine.server_config(query.config_format)
    return json_response({"vllm_config": config, "vllm_env": {}, "system_env": {}})


@api.post(
    "/weight_checker",
    "Weight checksums (the base weights and the adapters held): compute, reset (base "
    "weights), or compare with a baseline.",
    body=WeightCheckerRequest,
    ok=StatusAnswer | ChecksumsAnswer | CompareAnswer,
    errors=ENGINE_ERRORS,
    tag=_VLLM,
)
async def weight_checker(request: web.Request) -> web.Response:
    body = await parse_body(request, WeightCheckerRequest)
    service = agent_service(request)
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

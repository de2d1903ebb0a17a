"""Admin routes: vLLM's RL route shapes at the root.

The root routes take and return exactly what `vllm/entrypoints/rl/online/api_router.py`
does, so a client written for a vLLM RL server works against one agent. Most routes are
entries that name the service call they run and the answer they make (`handling.py` serves
them with one handler, which parses what the entry declares); the few with more to do have
handlers that parse, call the operation (`rlcp/agent/operations/`, reached through the
`AgentService`), and shape the answer; the operations decide everything else. This project's extras under /v1/agent are
in `extras.py`, the probes in `probes.py`, what they all share in `handling.py`.

Each route is declared once, as an entry or on its handler (`rlcp.core.openapi.RouteTable`): the app factory
registers the handlers from each module's `api`, and `rlcp.agent.admin.openapi` builds the
document from the same declarations. Request models are the wire models the handlers parse; the
small answers, which the handlers build as dicts, are described by models in `rlcp.core.wire.agent` too.
"""

from __future__ import annotations

from aiohttp import web

from rlcp.agent.admin.handling import ENGINE_ERRORS, agent_service, serve_engine_call, serve_read
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

_VLLM = "vLLM RL routes"
api = RouteTable(tag=_VLLM, context=agent_service)


serve_engine_call(
    api,
    "/pause",
    "Pause generation: abort, wait (drain) or keep (freeze) in-flight requests.",
    lambda service, query: service.control.pause(query.mode, query.timeout_s),
    {"status": "paused"},
    query=PauseQuery,
    ok=StatusAnswer,
)
serve_engine_call(
    api,
    "/resume",
    "Resume generation; frozen requests continue.",
    lambda service, _: service.control.resume(),
    {"status": "resumed"},
    ok=StatusAnswer,
)
serve_read(
    api,
    "/is_paused",
    "Whether generation is paused.",
    lambda service, _: {"is_paused": service.paused},
    ok=IsPausedAnswer,
)
serve_engine_call(
    api,
    "/sleep",
    "Sleep (vLLM's dev route): pause (`mode`), then release memory -- level 1 offloads the weights "
    "and drops the KV cache, level 2 discards both. Until woken, only pause, abort and wake_up are taken "
    "(409 otherwise) and the agent reports not ready. vLLM's CPU build pauses and ignores the rest.",
    lambda service, query: service.control.sleep(query.level, query.mode, query.timeout_s),
    lambda query, _: {"status": "sleeping", "level": query.level},
    query=SleepQuery,
    ok=SleepAnswer,
)


@api.post(
    "/wake_up",
    "Wake up (vLLM's dev route): every allocation, or the `tags` named; once fully awake the engine schedules again.",
    query=WakeUpQuery,
    ok=WakeUpAnswer,
    errors=ENGINE_ERRORS,
)
async def wake_up(request: web.Request) -> web.Response:
    # `tags` repeats (`?tags=weights&tags=kv_cache`): every value, not the first only.
    query = validate(WakeUpQuery, {"tags": request.query.getall("tags", [])})
    tags: list[str] | None = list(query.tags) or None
    fully_awake = await agent_service(request).control.wake_up(tags)
    return json_response({"status": "awake" if fully_awake else "sleeping", "tags": tags})


serve_read(
    api,
    "/is_sleeping",
    "Whether the engine is asleep (its memory released; a mere pause is not sleep).",
    lambda service, _: {"is_sleeping": service.control.sleeping},
    ok=IsSleepingAnswer,
)
serve_engine_call(
    api,
    "/reset_prefix_cache",
    "Drop the prefix cache (vLLM's dev route): `success` false while requests hold "
    "blocks and `reset_running_requests` was not given. Refused while asleep (409).",
    lambda service, query: service.caches.reset_prefix_cache(
        running=query.reset_running_requests, external=query.reset_external
    ),
    lambda _, done: {"success": done},
    query=ResetPrefixCacheQuery,
    ok=ResetPrefixCacheAnswer,
)
serve_engine_call(
    api,
    "/abort_requests",
    "Abort the named requests, or all of them.",
    lambda service, body: service.control.abort_requests(body.request_ids or None),
    lambda _, aborted: {"status": "aborted", "aborted": aborted},
    body=AbortRequestsRequest,
    body_optional=True,
    ok=AbortedAnswer,
)
serve_engine_call(
    api,
    "/init_weight_transfer_engine",
    "Join the trainer's weight-transfer group.",
    lambda service, body: service.transfer.init(body.init_info),
    {"message": "Weight transfer initialized"},
    body=InitWeightTransferRequest,
    ok=MessageAnswer,
)
serve_engine_call(
    api,
    "/start_weight_update",
    "Open a weight update.",
    lambda service, _: service.transfer.start(),
    {"message": "Weight update started"},
    ok=MessageAnswer,
)
serve_engine_call(
    api,
    "/update_weights",
    "Receive one update chunk (or a list) over the group.",
    lambda service, body: service.transfer.update(body.update_info),
    {"message": "Weights updated"},
    body=WeightTransferUpdateRequest,
    ok=MessageAnswer,
)
serve_engine_call(
    api,
    "/finish_weight_update",
    "Close the update; name the weights; drop the prefix cache.",
    lambda service, body: service.transfer.finish(body.weight_version),
    {"message": "Weight update finished"},
    body=FinishWeightUpdateRequest,
    body_optional=True,
    ok=MessageAnswer,
)
serve_engine_call(
    api,
    "/shutdown_weight_transfer_engine",
    "Leave the weight-transfer group.",
    lambda service, _: service.transfer.shutdown(),
    {"message": "Weight transfer shut down"},
    ok=MessageAnswer,
)
serve_engine_call(
    api,
    "/update_weight_version",
    "Name the weights the engine holds.",
    lambda service, body: service.weights.set_version(body.new_version),
    lambda body, _: {"success": True, "new_version": body.new_version},
    body=UpdateWeightVersionRequest,
    ok=VersionSetAnswer,
)
serve_read(
    api,
    "/weight_info",
    "The weight version.",
    lambda service, _: {"weight_version": service.weight_version},
    ok=WeightInfoAnswer,
)
serve_read(
    api,
    "/get_world_size",
    "Inference ranks behind this engine.",
    lambda service, query: {"world_size": service.engine.world_size(query.include_dp)},
    query=WorldSizeQuery,
    ok=WorldSizeAnswer,
)
serve_read(
    api,
    "/server_info",
    "The engine's resolved configuration, as vLLM's dev route answers it: `vllm_config` a JSON tree "
    "(`?config_format=json`) or vLLM's text form (the default). `vllm_env` and `system_env` are "
    "left empty: the engine host's environment is not the admin API's to publish.",
    lambda service, query: {
        "vllm_config": service.engine.server_config(query.config_format),
        "vllm_env": {},
        "system_env": {},
    },
    query=ServerInfoQuery,
    ok=ServerInfoAnswer,
)


@api.post(
    "/weight_checker",
    "Weight checksums (the base weights and the adapters held): compute, reset (base "
    "weights), or compare with a baseline.",
    body=WeightCheckerRequest,
    ok=StatusAnswer | ChecksumsAnswer | CompareAnswer,
    errors=ENGINE_ERRORS,
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

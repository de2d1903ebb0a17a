"""Compatibility facade: the fleet at the controller's root, shaped like one vLLM server.

Existing RL code that drives a single vLLM server (its RL routes, or the disk and LoRA
routes frameworks call on their inference servers) can point at the controller and drive
the whole fleet unchanged. Each route maps onto a native operation, so the rules hold:
one operation at a time (409), a 4xx naming the field before any worker is touched.

A call that did not succeed on every member is never a 2xx here, unlike the native API's
207: these clients (httpx's `raise_for_status`, requests, vLLM's own HTTP weight-sync
client) read any 2xx as success. It is a 502 `workers_failed` (503 `workers_unreachable`
when no member could be reached), naming the failed workers, with the operation and every
worker's result in `error.operation`. `GET /is_paused` is true only when every member is
reachable, its engine alive, and paused: a dead member is not known to be paused.

`POST /update_weights` is both vLLM's broadcast chunk (`{"update_info": ...}`) and the
disk update frameworks send (`{"weight_dir": ...}`); the body's keys say which.

vLLM's sleep-mode dev routes are the native fleet sleep and wake (`operations/sleep.py`): a
member asleep is out of the gateway's fence and kept asleep in the desired state; a wake
verifies it before it serves. Wakes add up as vLLM's do: `?tags=weights`, then
`?tags=kv_cache`, is a full wake. `/reset_prefix_cache` resets every member's cache, and a
member that could not is a failure. `/collective_rpc` is in `facade_rpc.py`, the reads (`/health`,
`/weight_info`, `/get_world_size`, `/v1/models`, `/server_info`) in `facade_info.py`; the table of
every route of vLLM's and its fleet meaning is in docs/controller.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import PurePosixPath
from typing import Any

from aiohttp import web

from rlcp.controlplane.api.answers import (
    DiskWeightsAnswer,
    DiskWeightsRequest,
    FinishWeightUpdateAnswer,
    LoadLoraAdapterRequest,
    StartWeightUpdateRequest,
    SuccessAnswer,
    UnloadLoraAdapterRequest,
)
from rlcp.controlplane.api.errors import FleetCallFailedApiError
from rlcp.controlplane.api.handling import CONTROLLER, Run, controller_of, declared
from rlcp.controlplane.api.routes.sleep import sleep_members
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.errors import ControlPlaneError
from rlcp.controlplane.operations import caches, lora, weights
from rlcp.controlplane.operations import pause as pausing
from rlcp.controlplane.operations import sleep as sleeping
from rlcp.core.errors import ApiError, ValidationFailedError
from rlcp.core.http import json_response, read_object, validate
from rlcp.core.openapi import Handler, RouteTable
from rlcp.core.wire.agent import (
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
)
from rlcp.core.wire.controller import (
    EmptyRequest,
    LoraRequest,
    OperationResult,
    PauseRequest,
    ResetPrefixCacheRequest,
    SleepRequest,
    TransferFinishRequest,
    TransferInitRequest,
    TransferUpdateRequest,
    UpdateWeightsRequest,
    WakeUpRequest,
)

FACADE_TAG = "vLLM-compatible facade"
api = RouteTable(tag=FACADE_TAG, context=controller_of)


def fleet_call(
    method: str, path: str, summary: str, *, errors: tuple[int, ...] = (), table: RouteTable = api, **kw: Any
) -> Callable[[Handler], Handler]:
    """The declaration of a facade route that runs a fleet operation, on its handler: a call that
    failed on some member is a 502 (503 when none was reached) in the error shape, never a 207."""
    return table.route(method, path, summary, **_fleet_declared(errors, kw))


# vLLM's answer to a call every member did: the same for every call, or made from what the
# route read and the operation's result.
VllmAnswer = Mapping[str, object] | Callable[[Any, OperationResult], Mapping[str, object]]


def serve_fleet_call(
    method: str,
    path: str,
    summary: str,
    run: Run,
    answer: VllmAnswer,
    *,
    errors: tuple[int, ...] = (),
    table: RouteTable = api,
    **kw: Any,
) -> None:
    """A facade route as an entry: `run(controller, input)` (input: what the route declares it
    reads), then vLLM's `answer` when every member did its part, else 502/503 as `fleet_call`."""

    async def call(ctl: Controller, given: Any) -> Mapping[str, object]:
        result = await run(ctl, given)
        return _vllm_answer(result, answer(given, result) if callable(answer) else answer)

    table.serve(method, path, summary, call, **_fleet_declared(errors, kw))


def _fleet_declared(errors: tuple[int, ...], kw: dict[str, Any]) -> dict[str, Any]:
    return declared(partial={}, errors=(502, *errors), **kw)


@contextmanager
def client_fields(names: Mapping[str, str]) -> Iterator[None]:
    """Errors of the native request a facade route builds name the field the client sent
    (`lora_name`, not `name`), so a 4xx points at the client's own input."""
    try:
        yield
    except (ApiError, ControlPlaneError) as exc:
        if exc.field is not None and exc.field in names:
            old, exc.field = exc.field, names[exc.field]
            if exc.message.startswith(f"{old}: "):
                exc.message = f"{exc.field}: {exc.message[len(old) + 2 :]}"
        raise


def _vllm_answer(result: OperationResult, answer: Mapping[str, object]) -> Mapping[str, object]:
    """vLLM's answer when every member did its part (or, a broadcast step, is doing it); else
    502/503 naming the workers that failed."""
    if result.status not in ("ok", "running"):
        raise FleetCallFailedApiError(result)
    return answer


async def _is_paused(ctl: Controller, _: None) -> dict[str, object]:
    workers = ctl.state().workers
    paused = bool(workers) and all(w.reachable and w.engine_alive is not False and w.paused is True for w in workers)
    return {"is_paused": paused}


async def _sleep(ctl: Controller, query: SleepQuery) -> OperationResult:
    if query.level == 0:
        raise ValidationFailedError(
            "level 0 only pauses scheduling, which on a fleet is POST "
            "/pause?mode=... (and POST /resume); level 1 or 2 puts the members to sleep",
            field="level",
        )
    req = validate(SleepRequest, {"level": query.level, "mode": query.mode, "timeout_s": query.timeout_s})
    return await sleep_members(ctl, req)


async def wake_up(request: web.Request) -> web.Response:
    tags = request.query.getall("tags", [])
    with client_fields({"tags": "tags"}):
        req = validate(WakeUpRequest, {"tags": tags or None})
    ctl = controller_of(request)
    result = await sleeping.wake_up(ctl, req)
    return json_response(
        _vllm_answer(result, {"status": "sleeping" if _asleep(ctl) else "awake", "tags": tags or None})
    )


def _asleep(ctl: Controller) -> list[str]:
    """The members asleep: kept so by the controller, or reporting themselves so."""
    return [w.id for w in ctl.state().workers if w.sleeping]


async def _is_sleeping(ctl: Controller, _: None) -> dict[str, object]:
    return {"is_sleeping": bool(_asleep(ctl))}


async def _reset_prefix_cache(ctl: Controller, query: ResetPrefixCacheQuery) -> OperationResult:
    req = ResetPrefixCacheRequest(
        reset_running_requests=query.reset_running_requests, reset_external=query.reset_external
    )
    return await caches.reset_prefix_cache(ctl, req)


async def _start_weight_update(ctl: Controller, body: StartWeightUpdateRequest) -> OperationResult:
    if not body.is_checkpoint_format:
        raise ValidationFailedError(
            "only checkpoint-format weights are loaded on the fleet (is_checkpoint_format: true): each member "
            "loads the chunks through its model's own weight loader",
            field="is_checkpoint_format",
        )
    return await ctl.transfer.start()


async def update_weights(request: web.Request) -> web.Response:
    data = await read_object(request)
    if "update_info" in data:  # vLLM's broadcast chunk
        chunk = validate(TransferUpdateRequest, data, strict=True)
        result = await request.config_dict[CONTROLLER].transfer.update_chunk(chunk)
        return json_response(_vllm_answer(result, {"message": "Weights updated"}))
    body = validate(DiskWeightsRequest, data, strict=True)
    version = body.weight_version or PurePosixPath(body.weight_dir).name
    # Without weight_version, the version is the directory's name: a bad one is the directory's fault.
    with client_fields(
        {"version": "weight_version" if body.weight_version else "weight_dir", "source.path": "weight_dir"}
    ):
        req = validate(UpdateWeightsRequest, {"version": version, "source": {"kind": "disk", "path": body.weight_dir}})
        result = await weights.update_weights(request.config_dict[CONTROLLER], req)
    return json_response(
        _vllm_answer(result, {"success": True, "message": "Weights updated", "weight_version": version})
    )


async def _load_lora(ctl: Controller, body: LoadLoraAdapterRequest) -> OperationResult:
    with client_fields({"name": "lora_name", "path": "lora_path"}):
        req = validate(LoraRequest, {"name": body.lora_name, "path": body.lora_path})
        return await lora.load_lora(ctl, req)


async def _unload_lora(ctl: Controller, body: UnloadLoraAdapterRequest) -> OperationResult:
    with client_fields({"name": "lora_name"}):
        return await lora.unload_lora(ctl, body.lora_name)


def _lora_done(verb: str) -> VllmAnswer:
    return lambda body, _: {"success": True, "message": f"Success: LoRA adapter '{body.lora_name}' {verb}."}


# The routes, in the order they are registered and documented.
serve_fleet_call(
    "POST",
    "/pause",
    "Pause the fleet (vLLM's `/pause?mode=`).",
    lambda ctl, query: pausing.pause(ctl, PauseRequest(mode=query.mode, timeout_s=query.timeout_s)),
    {"status": "paused"},
    query=PauseQuery,
    ok=StatusAnswer,
)
serve_fleet_call(
    "POST", "/resume", "Resume the fleet.", lambda ctl, _: pausing.resume(ctl), {"status": "resumed"}, ok=StatusAnswer
)
api.serve(
    "GET",
    "/is_paused",
    "True when every member is reachable, its engine alive, and paused (a member that cannot "
    "be reached is not known to be paused); false otherwise, and with no members.",
    _is_paused,
    ok=IsPausedAnswer,
)
serve_fleet_call(
    "POST",
    "/sleep",
    "Put the fleet to sleep (vLLM's `/sleep?level=&mode=`): every member leaves the "
    "gateway's fence, pauses (`mode`: abort or wait) and releases memory (`level` 1 or 2), kept asleep until "
    "`/wake_up`. Level 0 (a pause only) is `/pause`; 409 while a weight-transfer group is formed.",
    _sleep,
    lambda query, _: {"status": "sleeping", "level": query.level},
    query=SleepQuery,
    ok=SleepAnswer,
    errors=(404,),
)
fleet_call(
    "POST",
    "/wake_up",
    "Wake the fleet (vLLM's `/wake_up?tags=`): every member asleep is woken; once "
    "fully awake (no tags, both, or the last one still asleep) each is brought to the fleet's weights, "
    "verified, and only then serves again. `status` is `sleeping` while some member has memory asleep.",
    query=WakeUpQuery,
    ok=WakeUpAnswer,
    errors=(404,),
)(wake_up)
api.serve(
    "GET",
    "/is_sleeping",
    "True while some member is asleep (kept asleep by the controller, or reporting itself "
    "so): what `/wake_up` would wake. False with no members.",
    _is_sleeping,
    ok=IsSleepingAnswer,
)
serve_fleet_call(
    "POST",
    "/reset_prefix_cache",
    "Every member in service drops its prefix cache (vLLM's "
    "`/reset_prefix_cache?reset_running_requests=&reset_external=`); a member that could not (blocks held "
    "by running requests) is a failure, 502 naming it.",
    _reset_prefix_cache,
    {"success": True},
    query=ResetPrefixCacheQuery,
    ok=ResetPrefixCacheAnswer,
)
serve_fleet_call(
    "POST",
    "/init_weight_transfer_engine",
    "The broadcast init, fleet-wide.",
    lambda ctl, body: ctl.transfer.init(body),
    {"message": "Weight transfer initialized"},
    body=TransferInitRequest,
    ok=MessageAnswer,
)
serve_fleet_call(
    "POST",
    "/start_weight_update",
    "The broadcast start: pauses a fleet the trainer has not paused (finish resumes it). "
    "`is_checkpoint_format: true` (TRL's async client) is accepted; vLLM 0.32 reads no body.",
    _start_weight_update,
    {"message": "Weight update started"},
    body=StartWeightUpdateRequest,
    body_optional=True,
    ok=MessageAnswer,
)
serve_fleet_call(
    "POST",
    "/finish_weight_update",
    "The broadcast finish: every member takes the new weights under `weight_version`, or, with "
    "none named (TRL names none), under a version the controller mints (`broadcast-<n>`), named in the "
    "answer; a fleet the start paused serves again (no `/resume` needed).",
    lambda ctl, body: ctl.transfer.finish(body),
    lambda _, result: {"message": "Weight update finished", "weight_version": result.detail.get("version")},
    body=TransferFinishRequest,
    body_optional=True,
    ok=FinishWeightUpdateAnswer,
    errors=(403,),
)
serve_fleet_call(
    "POST",
    "/shutdown_weight_transfer_engine",
    "Every worker leaves the group.",
    lambda ctl, _: ctl.transfer.shutdown(),
    {"message": "Weight transfer shut down"},
    body=EmptyRequest,
    body_optional=True,
    ok=MessageAnswer,
)
serve_fleet_call(
    "POST",
    "/update_weight_version",
    "Name the weights on every member.",
    lambda ctl, body: ctl.transfer.update_weight_version(body.new_version),
    lambda body, _: {"success": True, "new_version": body.new_version},
    body=UpdateWeightVersionRequest,
    ok=VersionSetAnswer,
)
fleet_call(
    "POST",
    "/update_weights",
    "A broadcast chunk (`update_info`), or a disk update (`weight_dir`).",
    body=TransferUpdateRequest | DiskWeightsRequest,
    ok=MessageAnswer | DiskWeightsAnswer,
    errors=(403,),
)(update_weights)
# Each at vLLM's dev-server path and at its OpenAI-server path (prime-rl calls the latter to unload).
_UNLOAD = (
    "Unload a LoRA adapter fleet-wide (vLLM's shape): removed from every engine, not only from the served "
    "names (vLLM's own HTTP unload leaves it loaded)."
)
for _path, _summary, _run, _body, _verb, _errors in (
    (
        "/load_lora_adapter",
        "Load a LoRA adapter fleet-wide (vLLM's shape).",
        _load_lora,
        LoadLoraAdapterRequest,
        "added",
        (403,),
    ),
    (
        "/v1/load_lora_adapter",
        "The same, at vLLM's OpenAI-server path.",
        _load_lora,
        LoadLoraAdapterRequest,
        "added",
        (403,),
    ),
    ("/unload_lora_adapter", _UNLOAD, _unload_lora, UnloadLoraAdapterRequest, "removed", (404,)),
    (
        "/v1/unload_lora_adapter",
        "The same, at vLLM's OpenAI-server path (prime-rl calls this one).",
        _unload_lora,
        UnloadLoraAdapterRequest,
        "removed",
        (404,),
    ),
):
    serve_fleet_call("POST", _path, _summary, _run, _lora_done(_verb), body=_body, ok=SuccessAnswer, errors=_errors)

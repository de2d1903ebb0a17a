"""The controller's native HTTP API (docs/controller.md, "API") and its probes, each route declared once
on its handler (the OpenAPI document is built from the same declarations).

Handlers parse, call an operation, and shape the answer; errors leave through the shared
middleware as JSON. Operation routes answer an `OperationResult`: 200 every worker ok, 207
some failed, 502 none ok (a broadcast step: any failed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, Field

from rlcp.controlplane.api.answers import OperationsAnswer, WeightTransferInfo, WorkersListing
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.discovery.http_listing import render_listing
from rlcp.controlplane.errors import Conflict, InvalidInput, NotFound
from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.controlplane.fleet.select import read_selector, selected
from rlcp.controlplane.operations import caches, engine, lora, pause, sleep, weights
from rlcp.controlplane.workers.capabilities import capabilities
from rlcp.core.cached import cached_response
from rlcp.core.http import json_response, parse_body, validate
from rlcp.core.openapi import Handler, RouteTable
from rlcp.core.wire.agent.state import ProbeAnswer
from rlcp.core.wire.controller import (
    EmptyRequest,
    EngineRouteRequest,
    FleetState,
    LoraRequest,
    OperationResult,
    OperationsQuery,
    PauseRequest,
    PlacementRequest,
    PlacementView,
    ResetPrefixCacheRequest,
    ResumeRequest,
    SelectorQuery,
    SleepRequest,
    StalenessRequest,
    TransferFinishRequest,
    TransferInitRequest,
    TransferUpdateRequest,
    UpdateWeightsRequest,
    WakeUpRequest,
)

CONTROLLER = web.AppKey("controller", Controller)
SESSION = web.AppKey("session", aiohttp.ClientSession)  # the one client session for worker calls
api = RouteTable()

# Every write: 409 another operation runs (or this replica does not lead, or a member lacks a
# capability), 503 no members.
WRITE_ERRORS = (409, 503)
PARTIAL: dict[int, Any] = {207: OperationResult, 502: OperationResult}
STEP: dict[int, Any] = {502: OperationResult}  # a broadcast step is one collective: any failure is 502
_NATIVE, _TRANSFER = "fleet", "weight transfer"


def operation(
    method: str,
    path: str,
    summary: str,
    *,
    partial: dict[int, Any] = PARTIAL,
    ok: Any = OperationResult,
    errors: tuple[int, ...] = (),
    tag: str = _NATIVE,
    table: RouteTable = api,
    **kw: Any,
) -> Callable[[Handler], Handler]:
    """The declaration of a route that runs a fleet operation."""
    return table.route(method, path, summary, ok=ok, answers=partial, errors=(*WRITE_ERRORS, *errors), tag=tag, **kw)


def http_status(result: OperationResult) -> int:
    """200 all ok (or still running, for a step of an open session); 207 some failed;
    502 none ok. Never 200 with an error inside. A broadcast step is one collective: a
    worker that failed it failed the whole step, so any failure there is 502."""
    if result.status in ("ok", "running"):
        return 200
    if result.status == "partial" and not result.kind.startswith("weight_transfer"):
        return 207
    return 502


def operation_response(result: OperationResult) -> web.Response:
    return json_response(result, status=http_status(result))


def _ctl(request: web.Request) -> Controller:
    return request.config_dict[CONTROLLER]


@api.get(
    "/v1/rl/state",
    "The fleet state, from the cache (never a fan-out per request). Carries an `ETag`: "
    "with `If-None-Match` naming it, the answer is 304 with no body while nothing changed; gzip when "
    "`Accept-Encoding` allows it. With `selector`, `workers` lists only the matching members (the rest of "
    "the document is the whole fleet's) and the answer is made afresh, without an `ETag`.",
    query=SelectorQuery,
    ok=FleetState,
    answers={304: None},
    tag=_NATIVE,
)
async def get_state(request: web.Request) -> web.Response:
    ctl = _ctl(request)
    selector = read_selector(validate(SelectorQuery, dict(request.query)).selector)
    if selector is not None:
        state = ctl.state()
        return json_response(
            state.model_copy(update={"workers": [w for w in state.workers if selector.matches(w.labels)]})
        )
    return cached_response(request, etag=ctl.state_etag(), body=ctl.state_body)


@api.get(
    "/v1/rl/workers",
    "The members, in Dynamo's listing shape plus this project's fields (`labels` among "
    "them); with `selector`, only those whose labels match.",
    query=SelectorQuery,
    ok=WorkersListing,
    tag=_NATIVE,
)
async def get_workers(request: web.Request) -> web.Response:
    ctl = _ctl(request)
    members = selected(ctl.members(), read_selector(validate(SelectorQuery, dict(request.query)).selector))
    views = {v.id: v for v in (ctl.worker_view(r) for r in members)}
    listing = render_listing(
        [r.spec for r in members],
        namespace=ctl.settings.controller_id,
        serving={i: v.serving for i, v in views.items()},
        capabilities={r.id: capabilities(r.driver) for r in members},
    )
    for entry in listing["workers"]:
        view = views[entry["instance_id"]]
        entry.update(ready=view.ready, weight_version=view.weight_version, reachable=view.reachable)
    listing["membership_epoch"] = ctl.registry.membership.epoch
    return json_response(listing)


@api.get(
    "/v1/rl/operations", "Recent operations, newest first.", query=OperationsQuery, ok=OperationsAnswer, tag=_NATIVE
)
async def get_operations(request: web.Request) -> web.Response:
    query = validate(OperationsQuery, dict(request.query))
    ops = _ctl(request).log.recent(query.limit)
    return json_response({"operations": [op.model_dump(mode="json") for op in ops]})


@api.get(
    "/v1/rl/operations/{id}",
    "One operation, running or recent: its results, and a weight update's progress "
    "and bubble (404 once it is older than the kept history).",
    ok=OperationResult,
    errors=(404,),
    tag=_NATIVE,
    path_params={"id": {"type": "string", "minLength": 1}},
)
async def get_operation(request: web.Request) -> web.Response:
    operation_id = request.match_info["id"]
    found = _ctl(request).log.find(operation_id)
    if found is None:
        raise NotFound(f"no operation {operation_id!r} (running or among the recent ones)", field="id")
    return json_response(found)


@operation(
    "POST",
    "/v1/rl/pause",
    "Pause every member (with `selector`, only the matching members, held paused "
    "in the desired state); returns once quiesced or past the deadline.",
    body=PauseRequest,
    body_optional=True,
)
async def post_pause(request: web.Request) -> web.Response:
    body = await parse_body(request, PauseRequest, allow_empty=True)
    return operation_response(await pause.pause(_ctl(request), body))


@operation(
    "POST",
    "/v1/rl/resume",
    "Resume every member and release every hold (with `selector`, only the "
    "matching members; 409 while the whole fleet is paused).",
    body=ResumeRequest,
    body_optional=True,
)
async def post_resume(request: web.Request) -> web.Response:
    body = await parse_body(request, ResumeRequest, allow_empty=True)
    return operation_response(await pause.resume(_ctl(request), body))


@operation(
    "POST",
    "/v1/rl/sleep",
    "Put members to sleep (vLLM's sleep mode; with `selector` or `worker_ids`, only "
    "those): they leave the gateway's fence at once, pause (`mode`) and release memory (`level`), and are kept "
    "asleep in the desired state -- left out of other operations, put back to sleep by the reconciler -- until "
    "woken. 409 naming a member whose flavor has no sleep mode, or while a weight-transfer group is formed.",
    body=SleepRequest,
    body_optional=True,
    errors=(404,),
)
async def post_sleep(request: web.Request) -> web.Response:
    body = await parse_body(request, SleepRequest, allow_empty=True)
    return operation_response(await sleep_members(_ctl(request), body))


async def sleep_members(ctl: Controller, body: SleepRequest) -> OperationResult:
    """The fleet's sleep, here and on the facade: refused (409) while a weight-transfer group
    is formed -- its ranks span every member, and an engine asleep cannot take a broadcast."""
    if ctl.transfer.view() is not None:
        raise Conflict(
            "a weight-transfer group spans the fleet: POST /v1/rl/weight_transfer/shutdown (or "
            "/shutdown_weight_transfer_engine) before putting members to sleep"
        )
    return await sleep.sleep(ctl, body)


@operation(
    "POST",
    "/v1/rl/wake_up",
    "Wake members asleep (with `selector` or `worker_ids`, only those): each is "
    "woken, brought to the fleet's weights where it fell behind, verified (version, and its checksums against "
    "those it slept with), and only then returns inside the fence and resumes. A member that fails stays "
    "asleep, its result naming why. `tags` wakes part of the memory and leaves the members asleep.",
    body=WakeUpRequest,
    body_optional=True,
    errors=(404,),
)
async def post_wake_up(request: web.Request) -> web.Response:
    body = await parse_body(request, WakeUpRequest, allow_empty=True)
    return operation_response(await sleep.wake_up(_ctl(request), body))


@operation(
    "POST",
    "/v1/rl/reset_prefix_cache",
    "Every member in service (with `selector`, the matching ones) drops "
    "its prefix cache; a member whose engine could not (blocks held by running requests, without "
    "`reset_running_requests`) failed. The fleet resets them itself on every weight update and adapter swap. "
    "409 naming a member whose flavor has no reset.",
    body=ResetPrefixCacheRequest,
    body_optional=True,
)
async def post_reset_prefix_cache(request: web.Request) -> web.Response:
    body = await parse_body(request, ResetPrefixCacheRequest, allow_empty=True)
    return operation_response(await caches.reset_prefix_cache(_ctl(request), body))


@operation(
    "POST",
    "/v1/rl/update_weights",
    "The update transaction: pause, load from disk, verify, resume -- all "
    "at once or in rolling waves. With `wait: false`, 202 with the running operation at once (its `Location` "
    "follows it).",
    body=UpdateWeightsRequest,
    errors=(403,),
    partial={**PARTIAL, 202: OperationResult},
)
async def post_update_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightsRequest)
    result = await weights.update_weights(_ctl(request), body)
    if not body.wait and result.status == "running":
        accepted = json_response(result, status=202)
        fleet_base = request.path[: request.path.rfind("/v1/rl/")]  # "" at the root, /fleets/<name> for a named fleet
        accepted.headers["Location"] = f"{fleet_base}/v1/rl/operations/{result.id}"
        return accepted
    return operation_response(result)


@operation("POST", "/v1/rl/loras", "Load or hot-swap a LoRA adapter fleet-wide.", body=LoraRequest, errors=(403,))
async def post_lora(request: web.Request) -> web.Response:
    body = await parse_body(request, LoraRequest)
    return operation_response(await lora.load_lora(_ctl(request), body))


@operation(
    "DELETE",
    "/v1/rl/loras/{name}",
    "Unload an adapter everywhere (404 if the fleet has none of that name).",
    path_params={"name": {"type": "string", "minLength": 1}},
)
async def delete_lora(request: web.Request) -> web.Response:
    return operation_response(await lora.unload_lora(_ctl(request), request.match_info["name"]))


@operation(
    "POST",
    "/v1/rl/engine/{route}",
    "Run one engine route from the allowlist (settings "
    "`engine_routes.allow`, per flavor) on one `worker`, the members a `selector` names, or the whole fleet; "
    "403 naming a route not allowed. Recorded as an operation; the touched workers are read again after it. "
    "When every member it reached refused it with a 4xx (a body the engine cannot read), that 4xx "
    "(`engine_rejected`, naming each worker, with the operation in `error.operation`); a 5xx or a lost "
    "connection is the fleet's failure (502).",
    body=EngineRouteRequest,
    body_optional=True,
    errors=(403, 404),
    path_params={"route": {"type": "string", "minLength": 1}},
)
async def post_engine_route(request: web.Request) -> web.Response:
    body = await parse_body(request, EngineRouteRequest, allow_empty=True)
    ctl = _ctl(request)
    return operation_response(
        await engine.run_engine_route(ctl, request.match_info["route"], body, ctl.settings.engine_routes.allow)
    )


@api.get(
    "/v1/rl/weight_transfer",
    "World sizes for the trainer's init info, and the current group.",
    ok=WeightTransferInfo,
    tag=_TRANSFER,
)
async def get_weight_transfer(request: web.Request) -> web.Response:
    transfer = _ctl(request).transfer
    ranks = transfer.world_size()
    group = transfer.view()
    return json_response(
        {
            "inference_world_size": ranks,
            "trainer_world_size": ranks + 1,
            "group": group.model_dump(mode="json") if group else None,
        }
    )


@operation(
    "POST",
    "/v1/rl/weight_transfer/init",
    "Every worker joins the trainer's group at its rank offset.",
    body=TransferInitRequest,
    partial=STEP,
    tag=_TRANSFER,
)
async def post_transfer_init(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferInitRequest)
    return operation_response(await _ctl(request).transfer.init(body))


@operation(
    "POST",
    "/v1/rl/weight_transfer/start",
    "Open an update (pausing the fleet if the trainer did not).",
    body=EmptyRequest,
    body_optional=True,
    partial=STEP,
    tag=_TRANSFER,
)
async def post_transfer_start(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    return operation_response(await _ctl(request).transfer.start())


@operation(
    "POST",
    "/v1/rl/weight_transfer/update",
    "One update chunk, on every worker at once.",
    body=TransferUpdateRequest,
    partial=STEP,
    tag=_TRANSFER,
)
async def post_transfer_update(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferUpdateRequest)
    return operation_response(await _ctl(request).transfer.update_chunk(body))


@operation(
    "POST",
    "/v1/rl/weight_transfer/finish",
    "End the update, verify, resume what start paused.",
    body=TransferFinishRequest,
    body_optional=True,
    partial=STEP,
    errors=(403,),
    tag=_TRANSFER,
)
async def post_transfer_finish(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferFinishRequest, allow_empty=True)
    return operation_response(await _ctl(request).transfer.finish(body))


@operation(
    "POST",
    "/v1/rl/weight_transfer/shutdown",
    "Every worker leaves the group.",
    body=EmptyRequest,
    body_optional=True,
    partial=STEP,
    tag=_TRANSFER,
)
async def post_transfer_shutdown(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    return operation_response(await _ctl(request).transfer.shutdown())


class StalenessAnswer(BaseModel):
    staleness_bound: int
    allowed_versions: list[str] = Field(description="What the gateway's fence admits with it, desired first.")


@api.post(
    "/v1/rl/gateway/staleness",
    "Let the gateway route to members at one of the last `bound` versions "
    "before the desired one (kept in the desired state).",
    body=StalenessRequest,
    ok=StalenessAnswer,
    errors=(409,),
    tag=_NATIVE,
)
async def post_staleness(request: web.Request) -> web.Response:
    body = await parse_body(request, StalenessRequest)
    ctl = _ctl(request)
    async with ctl.gate.api_operation("set_staleness"):
        await ctl.desired.set_staleness_bound(body.bound)
    d = ctl.desired.state
    return json_response(
        {
            "staleness_bound": d.staleness_bound,
            "allowed_versions": admitted_versions(d.weight_version, d.applied_versions, body.bound),
        }
    )


def _placement_view(ctl: Controller) -> PlacementView:
    if ctl.placement is None:
        return PlacementView(kind="none", replicas=None, replicas_from=None, leading=ctl.leadership.is_leader)
    return ctl.placement.view(leading=ctl.leadership.is_leader)


@api.get(
    "/v1/rl/placement",
    "The agents placement keeps (placement.kind ray): the count, where it comes from, "
    "and the actors and groups of the last pass.",
    ok=PlacementView,
    tag=_NATIVE,
)
async def get_placement(request: web.Request) -> web.Response:
    return json_response(_placement_view(_ctl(request)))


@api.put(
    "/v1/rl/placement",
    "Scale: set the count of agents to keep placed (kept in the desired state, so it "
    "outlives restarts; null hands it back to the settings). Answers once the count is stored; the placement "
    "loop acts at once, and the new agents join through discovery.",
    body=PlacementRequest,
    ok=PlacementView,
    errors=(409,),
    tag=_NATIVE,
)
async def put_placement(request: web.Request) -> web.Response:
    body = await parse_body(request, PlacementRequest)
    ctl = _ctl(request)
    if ctl.placement is None:
        raise Conflict("placement.kind is none: this controller places no agents, so there is nothing to scale")
    most = ctl.placement.settings.max_replicas
    if body.replicas is not None and body.replicas > most:
        raise InvalidInput(f"replicas {body.replicas} is above placement.ray.max_replicas ({most})", field="replicas")
    async with ctl.gate.api_operation("set_placement"):
        await ctl.desired.set_placement_replicas(body.replicas)
    ctl.placement.wake()
    return json_response(_placement_view(ctl))


# -- probes ---------------------------------------------------------------------------------
@api.get("/healthz", "Liveness.", ok=ProbeAnswer, probe=True, tag="probes")
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@api.get(
    "/readyz", "Readiness: discovery has synced.", ok=ProbeAnswer, answers={503: ProbeAnswer}, probe=True, tag="probes"
)
async def readyz(request: web.Request) -> web.Response:
    ctl = _ctl(request)
    leader = ctl.leadership.leader_identity
    if not ctl.registry.membership.synced:
        return json_response(
            {"status": "not_ready", "reason": "discovery has not synced", "leader": leader}, status=503
        )
    if leader is None:
        return json_response({"status": "not_ready", "reason": "no leader is elected yet", "leader": None}, status=503)
    return json_response({"status": "ready", "leader": leader, "leading": ctl.leadership.is_leader})


@api.get("/metrics", "Prometheus metrics.", ok=str, media_type="text/plain", tag="probes")
async def metrics(request: web.Request) -> web.Response:
    ctl = _ctl(request)
    ready = sum(1 for r in ctl.members() if ctl.worker_view(r).ready)
    return web.Response(body=ctl.metrics.render(ready), content_type="text/plain", charset="utf-8")

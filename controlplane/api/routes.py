"""The controller's native HTTP API (DESIGN §3.1). Handlers parse, call an operation,
and shape the answer; errors leave through the shared middleware as JSON."""

from __future__ import annotations

from aiohttp import web

from agents.admin.http import json_response, parse_body, validate
from controlplane.controller import Controller
from controlplane.discovery.http_listing import render_listing
from controlplane import transaction
from controlplane.operations import http_status
from controlplane.state import (EmptyRequest, LoraRequest, OperationsQuery, OperationResult, PauseRequest, ResumeRequest, TransferFinishRequest,
                                TransferInitRequest, TransferUpdateRequest, UpdateWeightsRequest)

CONTROLLER = web.AppKey("controller", Controller)
routes = web.RouteTableDef()


def _ctl(request: web.Request) -> Controller:
    return request.app[CONTROLLER]


def operation_response(result: OperationResult) -> web.Response:
    return json_response(result, status=http_status(result))


@routes.get("/v1/rl/state")
async def get_state(request: web.Request) -> web.Response:
    # Served from the cached document: no fan-out, and no rebuild unless something changed.
    return web.Response(body=_ctl(request).state_json(), content_type="application/json")


@routes.get("/v1/rl/workers")
async def get_workers(request: web.Request) -> web.Response:
    ctl = _ctl(request)
    views = {v.id: v for v in (ctl.worker_view(r) for r in ctl.members())}
    listing = render_listing([r.spec for r in ctl.members()], namespace=ctl.settings.controller_id,
                             serving={i: v.serving for i, v in views.items()})
    for entry in listing["workers"]:
        view = views[entry["instance_id"]]
        entry.update(ready=view.ready, weight_version=view.weight_version, reachable=view.reachable)
    listing["membership_epoch"] = ctl.membership.epoch
    return json_response(listing)


@routes.get("/v1/rl/operations")
async def get_operations(request: web.Request) -> web.Response:
    """Recent operations, newest first (the running one included)."""
    query = validate(OperationsQuery, dict(request.query))
    ctl = _ctl(request)
    ops = [ctl.current.snapshot()] if ctl.current is not None else []
    ops += reversed(ctl.history)
    return json_response({"operations": [op.model_dump(mode="json") for op in ops[:query.limit]]})


@routes.post("/v1/rl/pause")
async def post_pause(request: web.Request) -> web.Response:
    body = await parse_body(request, PauseRequest, allow_empty=True)
    return operation_response(await transaction.pause(_ctl(request), body))


@routes.post("/v1/rl/resume")
async def post_resume(request: web.Request) -> web.Response:
    await parse_body(request, ResumeRequest, allow_empty=True)
    return operation_response(await transaction.resume(_ctl(request)))


@routes.post("/v1/rl/update_weights")
async def post_update_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightsRequest)
    return operation_response(await transaction.update_weights(_ctl(request), body))


@routes.post("/v1/rl/loras")
async def post_lora(request: web.Request) -> web.Response:
    body = await parse_body(request, LoraRequest)
    return operation_response(await transaction.load_lora(_ctl(request), body))


@routes.delete("/v1/rl/loras/{name}")
async def delete_lora(request: web.Request) -> web.Response:
    return operation_response(await transaction.unload_lora(_ctl(request), request.match_info["name"]))


@routes.get("/v1/rl/weight_transfer")
async def get_weight_transfer(request: web.Request) -> web.Response:
    transfer = _ctl(request).transfer
    ranks = transfer.world_size()
    group = transfer.view()
    return json_response({"inference_world_size": ranks, "trainer_world_size": ranks + 1,
                          "group": group.model_dump(mode="json") if group else None})


@routes.post("/v1/rl/weight_transfer/init")
async def post_transfer_init(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferInitRequest)
    return operation_response(await _ctl(request).transfer.init(body))


@routes.post("/v1/rl/weight_transfer/start")
async def post_transfer_start(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    return operation_response(await _ctl(request).transfer.start())


@routes.post("/v1/rl/weight_transfer/update")
async def post_transfer_update(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferUpdateRequest)
    return operation_response(await _ctl(request).transfer.update_chunk(body))


@routes.post("/v1/rl/weight_transfer/finish")
async def post_transfer_finish(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferFinishRequest, allow_empty=True)
    return operation_response(await _ctl(request).transfer.finish(body))


@routes.post("/v1/rl/weight_transfer/shutdown")
async def post_transfer_shutdown(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    return operation_response(await _ctl(request).transfer.shutdown())


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    ctl = _ctl(request)
    leader = ctl.leadership.leader_identity
    if not ctl.membership.synced:
        return json_response({"status": "not_ready", "reason": "discovery has not synced", "leader": leader},
                             status=503)
    if leader is None:
        return json_response({"status": "not_ready", "reason": "no leader is elected yet", "leader": None},
                             status=503)
    return json_response({"status": "ready", "leader": leader, "leading": ctl.leadership.is_leader})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    ctl = _ctl(request)
    ready = sum(1 for r in ctl.members() if ctl.worker_view(r).ready)
    return web.Response(body=ctl.metrics.render(ready), content_type="text/plain", charset="utf-8")

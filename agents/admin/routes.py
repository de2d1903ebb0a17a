"""Admin routes: vLLM's RL route shapes at the root, this project's extras under /v1/agent.

The root routes take and return exactly what `vllm/entrypoints/rl/online/api_router.py`
does, so a client written for a vLLM RL server works against one agent. Handlers parse,
call the service, and shape the answer; the service decides everything else.
"""

from __future__ import annotations

from aiohttp import web

from agents.admin.http import json_response, parse_body, validate
from agents.errors import ValidationFailedError
from agents.service import AgentService
from agents.wire import (AbortRequestsRequest, DesiredVersionRequest, DiskUpdateRequest, FinishWeightUpdateRequest,
                         InitWeightTransferRequest, LoraLoadRequest, PauseQuery, UpdateWeightsRequest,
                         UpdateWeightVersionRequest, WeightCheckerRequest, WorldSizeQuery)

SERVICE = web.AppKey("service", AgentService)
routes = web.RouteTableDef()


def _service(request: web.Request) -> AgentService:
    return request.app[SERVICE]


# -- vLLM RL route shapes ------------------------------------------------------------
@routes.post("/pause")
async def pause(request: web.Request) -> web.Response:
    query = validate(PauseQuery, dict(request.query))
    await _service(request).pause(query.mode, query.timeout_s)
    return json_response({"status": "paused"})


@routes.post("/resume")
async def resume(request: web.Request) -> web.Response:
    await _service(request).resume()
    return json_response({"status": "resumed"})


@routes.get("/is_paused")
async def is_paused(request: web.Request) -> web.Response:
    return json_response({"is_paused": _service(request).paused})


@routes.post("/abort_requests")
async def abort_requests(request: web.Request) -> web.Response:
    body = await parse_body(request, AbortRequestsRequest, allow_empty=True)
    aborted = await _service(request).abort_requests(body.request_ids or None)
    return json_response({"status": "aborted", "aborted": aborted})


@routes.post("/init_weight_transfer_engine")
async def init_weight_transfer_engine(request: web.Request) -> web.Response:
    body = await parse_body(request, InitWeightTransferRequest)
    await _service(request).init_weight_transfer(body.init_info)
    return json_response({"message": "Weight transfer initialized"})


@routes.post("/start_weight_update")
async def start_weight_update(request: web.Request) -> web.Response:
    await _service(request).start_weight_update()
    return json_response({"message": "Weight update started"})


@routes.post("/update_weights")
async def update_weights(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightsRequest)
    await _service(request).update_weights(body.update_info)
    return json_response({"message": "Weights updated"})


@routes.post("/finish_weight_update")
async def finish_weight_update(request: web.Request) -> web.Response:
    body = await parse_body(request, FinishWeightUpdateRequest, allow_empty=True)
    await _service(request).finish_weight_update(body.weight_version)
    return json_response({"message": "Weight update finished"})


@routes.post("/shutdown_weight_transfer_engine")
async def shutdown_weight_transfer_engine(request: web.Request) -> web.Response:
    await _service(request).shutdown_weight_transfer()
    return json_response({"message": "Weight transfer shut down"})


@routes.post("/update_weight_version")
async def update_weight_version(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightVersionRequest)
    await _service(request).update_weight_version(body.new_version)
    return json_response({"success": True, "new_version": body.new_version})


@routes.get("/weight_info")
async def weight_info(request: web.Request) -> web.Response:
    return json_response({"weight_version": _service(request).weight_version})


@routes.get("/get_world_size")
async def get_world_size(request: web.Request) -> web.Response:
    query = validate(WorldSizeQuery, dict(request.query))
    return json_response({"world_size": _service(request).engine.world_size(query.include_dp)})


@routes.post("/weight_checker")
async def weight_checker(request: web.Request) -> web.Response:
    body = await parse_body(request, WeightCheckerRequest)
    service = _service(request)
    if body.action == "reset":
        await service.reset_weight_checker()
        return json_response({"status": "reset"})
    if body.action == "compare" and body.baseline is None:
        raise ValidationFailedError("action='compare' requires a 'baseline' object", field="baseline")
    checksums = await service.weight_checksums()
    if body.action == "checksum":
        return json_response({"checksums": checksums})
    assert body.baseline is not None
    mismatches = sorted(k for k in checksums.keys() | body.baseline.keys() if checksums.get(k) != body.baseline.get(k))
    return json_response({"match": not mismatches, "mismatches": mismatches})


# -- this project's extras -------------------------------------------------------------
@routes.get("/v1/agent/state")
async def state(request: web.Request) -> web.Response:
    return json_response(_service(request).state())


@routes.post("/v1/agent/weights/disk")
async def update_weights_from_disk(request: web.Request) -> web.Response:
    body = await parse_body(request, DiskUpdateRequest)
    service = _service(request)
    await service.update_weights_from_disk(body)
    return json_response({"status": "updated", "weight_version": service.weight_version})


@routes.post("/v1/agent/loras")
async def load_lora(request: web.Request) -> web.Response:
    body = await parse_body(request, LoraLoadRequest)
    info = await _service(request).load_lora(body)
    return json_response(info)


@routes.delete("/v1/agent/loras/{name}")
async def unload_lora(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    remaining = await _service(request).unload_lora(name)
    return json_response({"status": "unloaded", "name": name, "engine_adapter_ids": sorted(remaining)})


@routes.put("/v1/agent/desired")
async def set_desired(request: web.Request) -> web.Response:
    body = await parse_body(request, DesiredVersionRequest)
    service = _service(request)
    service.set_desired_version(body.weight_version)
    return json_response(service.state())


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    service = _service(request)
    alive = service.engine.is_alive()
    return json_response({"status": "ok" if alive else "engine_dead"}, status=200 if alive else 503)


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    reason = _service(request).not_ready_reason()
    if reason is None:
        return json_response({"status": "ready"})
    return json_response({"status": "not_ready", "reason": reason}, status=503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    service = _service(request)
    return web.Response(body=service.metrics.render(service), content_type="text/plain", charset="utf-8")

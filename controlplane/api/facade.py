"""Compatibility facade: the fleet at the controller's root, shaped like one vLLM server.

Existing RL code that drives a single vLLM server (its RL routes, or the disk and LoRA
routes frameworks call on their inference servers) can point at the controller and drive
the whole fleet unchanged. Each route maps onto a native operation, so the rules hold:
one operation at a time (409), a 4xx naming the field before any worker is touched,
and a partial failure is a 207/502 with every worker's result -- never 200.

`POST /update_weights` is both vLLM's broadcast chunk (`{"update_info": ...}`) and the
disk update frameworks send (`{"weight_dir": ...}`); the body's keys say which. A
broadcast step that fails on any worker answers 502, so vLLM's own HTTP weight-sync
client (which raises on a non-2xx) stops at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import PurePosixPath

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from agents.admin.http import json_response, parse_body, read_object, validate
from agents.errors import ApiError
from agents.wire import PauseQuery, UpdateWeightVersionRequest, WorldSizeQuery
from controlplane import transaction
from controlplane.api.routes import CONTROLLER, operation_response
from controlplane.state import (EmptyRequest, LoraRequest, OperationResult, PauseRequest, TransferFinishRequest,
                                TransferInitRequest, TransferUpdateRequest, UpdateWeightsRequest)

facade = web.RouteTableDef()


@contextmanager
def _client_fields(names: Mapping[str, str]) -> Iterator[None]:
    """Errors of the native request a facade route builds name the field the client sent
    (`lora_name`, not `name`), so a 4xx points at the client's own input."""
    try:
        yield
    except ApiError as exc:
        if exc.field in names:
            old, exc.field = exc.field, names[exc.field]
            if exc.message.startswith(f"{old}: "):
                exc.message = f"{exc.field}: {exc.message[len(old) + 2:]}"
        raise


class DiskWeightsRequest(BaseModel):
    """The shape RL frameworks send their inference servers for a disk update."""

    model_config = ConfigDict(extra="forbid")
    weight_dir: str = Field(min_length=1, description="Safetensors directory every worker can read.")
    weight_version: str | None = Field(None, min_length=1, max_length=256,
                                       description="Defaults to the directory's name.")


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=128)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = True  # accepted for vLLM compatibility: a same-name load always swaps in place


@facade.post("/pause")
async def pause(request: web.Request) -> web.Response:
    query = validate(PauseQuery, dict(request.query))
    result = await transaction.pause(request.app[CONTROLLER], PauseRequest(mode=query.mode, timeout_s=query.timeout_s))
    return operation_response(result) if result.status != "ok" else json_response({"status": "paused"})


@facade.post("/resume")
async def resume(request: web.Request) -> web.Response:
    result = await transaction.resume(request.app[CONTROLLER])
    return operation_response(result) if result.status != "ok" else json_response({"status": "resumed"})


@facade.get("/is_paused")
async def is_paused(request: web.Request) -> web.Response:
    return json_response({"is_paused": request.app[CONTROLLER].state().pause_state == "paused"})


def _vllm_answer(result: OperationResult, answer: dict) -> web.Response:
    return operation_response(result) if result.status not in ("ok", "running") else json_response(answer)


@facade.post("/init_weight_transfer_engine")
async def init_weight_transfer_engine(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferInitRequest)
    result = await request.app[CONTROLLER].transfer.init(body)
    return _vllm_answer(result, {"message": "Weight transfer initialized"})


@facade.post("/start_weight_update")
async def start_weight_update(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    result = await request.app[CONTROLLER].transfer.start()
    return _vllm_answer(result, {"message": "Weight update started"})


@facade.post("/finish_weight_update")
async def finish_weight_update(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferFinishRequest, allow_empty=True)
    result = await request.app[CONTROLLER].transfer.finish(body)
    return _vllm_answer(result, {"message": "Weight update finished"})


@facade.post("/shutdown_weight_transfer_engine")
async def shutdown_weight_transfer_engine(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    result = await request.app[CONTROLLER].transfer.shutdown()
    return _vllm_answer(result, {"message": "Weight transfer shut down"})


@facade.post("/update_weight_version")
async def update_weight_version(request: web.Request) -> web.Response:
    body = await parse_body(request, UpdateWeightVersionRequest)
    result = await request.app[CONTROLLER].transfer.update_weight_version(body.new_version)
    return _vllm_answer(result, {"success": True, "new_version": body.new_version})


@facade.post("/update_weights")
async def update_weights(request: web.Request) -> web.Response:
    data = await read_object(request)
    if "update_info" in data:  # vLLM's broadcast chunk
        chunk = validate(TransferUpdateRequest, data, strict=True)
        result = await request.app[CONTROLLER].transfer.update_chunk(chunk)
        return _vllm_answer(result, {"message": "Weights updated"})
    body = validate(DiskWeightsRequest, data, strict=True)
    version = body.weight_version or PurePosixPath(body.weight_dir).name
    # Without weight_version, the version is the directory's name: a bad one is the directory's fault.
    with _client_fields({"version": "weight_version" if body.weight_version else "weight_dir",
                         "source.path": "weight_dir"}):
        req = validate(UpdateWeightsRequest, {"version": version, "source": {"kind": "disk", "path": body.weight_dir}})
        result = await transaction.update_weights(request.app[CONTROLLER], req)
    if result.status != "ok":
        return operation_response(result)
    return json_response({"success": True, "message": "Weights updated", "weight_version": version})


@facade.post("/load_lora_adapter")
@facade.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: web.Request) -> web.Response:
    body = await parse_body(request, LoadLoraAdapterRequest)
    with _client_fields({"name": "lora_name", "path": "lora_path"}):
        req = validate(LoraRequest, {"name": body.lora_name, "path": body.lora_path})
        result = await transaction.load_lora(request.app[CONTROLLER], req)
    if result.status != "ok":
        return operation_response(result)
    return json_response({"success": True, "message": f"Success: LoRA adapter '{body.lora_name}' added."})


@facade.get("/health")
async def health(request: web.Request) -> web.Response:
    serving = any(w.serving for w in request.app[CONTROLLER].state().workers)
    return web.Response(status=200 if serving else 503)


@facade.get("/weight_info")
async def weight_info(request: web.Request) -> web.Response:
    return json_response({"weight_version": request.app[CONTROLLER].state().applied.weight_version})


@facade.get("/get_world_size")
async def get_world_size(request: web.Request) -> web.Response:
    validate(WorldSizeQuery, dict(request.query))
    return json_response({"world_size": request.app[CONTROLLER].transfer.world_size()})


@facade.get("/v1/models")
async def models(request: web.Request) -> web.Response:
    ctl = request.app[CONTROLLER]
    names = sorted({r.spec.model for r in ctl.members() if r.spec.model})
    data = [{"id": n, "object": "model", "owned_by": "rl-controlplane", "parent": None} for n in names]
    base = names[0] if names else None
    data += [{"id": lora, "object": "model", "owned_by": "rl-controlplane", "parent": base}
             for lora in sorted(ctl.desired.loras)]
    return json_response({"object": "list", "data": data})

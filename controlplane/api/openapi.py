"""The controller API, declared once: the native routes (`/v1/rl/*`), the compatibility facade
at the root, and the probes. The OpenAPI document at `GET /openapi.json` is built from it, and
the tests hold the registered routes to it (`agents.openapi.route_drift`).

Operation routes answer an `OperationResult`: 200 every worker ok, 207 some failed, 502 none
ok (a broadcast step: any failed); the facade answers vLLM's shapes on success and the same
`OperationResult` otherwise.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents.admin.openapi import (IsPausedAnswer, MessageAnswer, ProbeAnswer, StatusAnswer, VersionSetAnswer,
                                  WeightInfoAnswer, WorldSizeAnswer)
from agents.openapi import Route, build_document, openapi_route
from agents.wire import PauseQuery, UpdateWeightVersionRequest, WorldSizeQuery
from controlplane.api.facade import DiskWeightsRequest, LoadLoraAdapterRequest
from controlplane.state import (EmptyRequest, FleetState, LoraRequest, OperationResult, OperationsQuery, PauseRequest,
                                ResumeRequest, TransferFinishRequest, TransferGroupView, TransferInitRequest,
                                TransferUpdateRequest, UpdateWeightsRequest)
from controlplane.workers import Flavor


class ListedWorker(BaseModel):
    """One entry of the listing: Dynamo's fields, then this project's."""

    model_config = ConfigDict(extra="allow")
    instance_id: str
    system_url: str = Field(description="The admin URL again, for readers that only know Dynamo's fields.")
    routes: list[str]
    world_size: int
    admin_url: str
    inference_url: str | None
    flavor: Flavor
    model: str | None
    serving: bool
    ready: bool
    weight_version: str | None
    reachable: bool


class WorkersListing(BaseModel):
    model_config = ConfigDict(extra="allow")
    protocol_version: Literal[1]
    namespace: str
    workers: list[ListedWorker]
    membership_epoch: int


class OperationsAnswer(BaseModel):
    operations: list[OperationResult] = Field(description="Newest first, the running one included.")


class WeightTransferInfo(BaseModel):
    inference_world_size: int = Field(description="Inference ranks across the fleet.")
    trainer_world_size: int = Field(description="1 + inference_world_size: what the trainer's init info needs.")
    group: TransferGroupView | None


class DiskWeightsAnswer(BaseModel):
    success: Literal[True]
    message: str
    weight_version: str


class SuccessAnswer(BaseModel):
    success: Literal[True]
    message: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    owned_by: str
    parent: str | None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


# Every write: 409 another operation runs (or this replica does not lead), 503 no members.
_WRITE = (409, 503)
_PARTIAL: dict[int, Any] = {207: OperationResult, 502: OperationResult}
_STEP: dict[int, Any] = {502: OperationResult}  # a broadcast step is one collective: any failure is 502
_NATIVE, _TRANSFER, _FACADE = "fleet", "weight transfer", "vLLM-compatible facade"


def _op(method: str, path: str, summary: str, *, partial: dict[int, Any] = _PARTIAL, ok: Any = OperationResult,
        errors: tuple[int, ...] = (), tag: str = _NATIVE, **kw: Any) -> Route:
    return Route(method, path, summary, ok=ok, answers=partial, errors=(*_WRITE, *errors), tag=tag, **kw)


ROUTES: tuple[Route, ...] = (
    # -- native ----------------------------------------------------------------------------
    Route("GET", "/v1/rl/state", "The fleet state, from the cache (never a fan-out per request).", ok=FleetState,
          tag=_NATIVE),
    Route("GET", "/v1/rl/workers", "The members, in Dynamo's listing shape plus this project's fields.",
          ok=WorkersListing, tag=_NATIVE),
    Route("GET", "/v1/rl/operations", "Recent operations, newest first.", query=OperationsQuery,
          ok=OperationsAnswer, tag=_NATIVE),
    _op("POST", "/v1/rl/pause", "Pause every member; returns once quiesced or past the deadline.", body=PauseRequest,
        body_optional=True),
    _op("POST", "/v1/rl/resume", "Resume every member.", body=ResumeRequest, body_optional=True),
    _op("POST", "/v1/rl/update_weights", "The update transaction: pause, load from disk, verify, resume.",
        body=UpdateWeightsRequest, errors=(403,)),
    _op("POST", "/v1/rl/loras", "Load or hot-swap a LoRA adapter fleet-wide.", body=LoraRequest, errors=(403,)),
    _op("DELETE", "/v1/rl/loras/{name}", "Unload an adapter everywhere (404 if the fleet has none of that name).",
        path_params={"name": {"type": "string", "minLength": 1}}),
    Route("GET", "/v1/rl/weight_transfer", "World sizes for the trainer's init info, and the current group.",
          ok=WeightTransferInfo, tag=_TRANSFER),
    _op("POST", "/v1/rl/weight_transfer/init", "Every worker joins the trainer's group at its rank offset.",
        body=TransferInitRequest, partial=_STEP, tag=_TRANSFER),
    _op("POST", "/v1/rl/weight_transfer/start", "Open an update (pausing the fleet if the trainer did not).",
        body=EmptyRequest, body_optional=True, partial=_STEP, tag=_TRANSFER),
    _op("POST", "/v1/rl/weight_transfer/update", "One update chunk, on every worker at once.",
        body=TransferUpdateRequest, partial=_STEP, tag=_TRANSFER),
    _op("POST", "/v1/rl/weight_transfer/finish", "End the update, verify, resume what start paused.",
        body=TransferFinishRequest, body_optional=True, partial=_STEP, errors=(403,), tag=_TRANSFER),
    _op("POST", "/v1/rl/weight_transfer/shutdown", "Every worker leaves the group.", body=EmptyRequest,
        body_optional=True, partial=_STEP, tag=_TRANSFER),
    # -- probes ---------------------------------------------------------------------------
    Route("GET", "/healthz", "Liveness.", ok=ProbeAnswer, probe=True, tag="probes"),
    Route("GET", "/readyz", "Readiness: discovery has synced.", ok=ProbeAnswer, answers={503: ProbeAnswer},
          probe=True, tag="probes"),
    Route("GET", "/metrics", "Prometheus metrics.", ok=str, media_type="text/plain", tag="probes"),
    openapi_route(),
    # -- the facade: the fleet as one vLLM server -------------------------------------------
    _op("POST", "/pause", "Pause the fleet (vLLM's `/pause?mode=`).", query=PauseQuery, ok=StatusAnswer,
        tag=_FACADE),
    _op("POST", "/resume", "Resume the fleet.", ok=StatusAnswer, tag=_FACADE),
    Route("GET", "/is_paused", "True when every member is paused.", ok=IsPausedAnswer, tag=_FACADE),
    _op("POST", "/init_weight_transfer_engine", "The broadcast init, fleet-wide.", body=TransferInitRequest,
        ok=MessageAnswer, partial=_STEP, tag=_FACADE),
    _op("POST", "/start_weight_update", "The broadcast start.", body=EmptyRequest, body_optional=True,
        ok=MessageAnswer, partial=_STEP, tag=_FACADE),
    _op("POST", "/update_weights", "A broadcast chunk (`update_info`), or a disk update (`weight_dir`).",
        body=TransferUpdateRequest | DiskWeightsRequest, ok=MessageAnswer | DiskWeightsAnswer, errors=(403,),
        tag=_FACADE),
    _op("POST", "/finish_weight_update", "The broadcast finish.", body=TransferFinishRequest, body_optional=True,
        ok=MessageAnswer, partial=_STEP, errors=(403,), tag=_FACADE),
    _op("POST", "/shutdown_weight_transfer_engine", "Every worker leaves the group.", body=EmptyRequest,
        body_optional=True, ok=MessageAnswer, partial=_STEP, tag=_FACADE),
    _op("POST", "/update_weight_version", "Name the weights on every member.", body=UpdateWeightVersionRequest,
        ok=VersionSetAnswer, partial=_STEP, tag=_FACADE),
    _op("POST", "/load_lora_adapter", "Load a LoRA adapter fleet-wide (vLLM's shape).", body=LoadLoraAdapterRequest,
        ok=SuccessAnswer, errors=(403,), tag=_FACADE),
    _op("POST", "/v1/load_lora_adapter", "The same, at vLLM's OpenAI-server path.", body=LoadLoraAdapterRequest,
        ok=SuccessAnswer, errors=(403,), tag=_FACADE),
    Route("GET", "/health", "200 while some worker serves, else 503 (no body).", answers={503: None}, probe=True,
          tag=_FACADE),
    Route("GET", "/weight_info", "The fleet's common weight version (null when members disagree).",
          ok=WeightInfoAnswer, tag=_FACADE),
    Route("GET", "/get_world_size", "Total inference ranks of the fleet.", query=WorldSizeQuery, ok=WorldSizeAnswer,
          tag=_FACADE),
    Route("GET", "/v1/models", "The fleet's base model and the desired adapters.", ok=ModelList, tag=_FACADE),
)

DESCRIPTION = ("The fleet controller. `/v1/rl/*` is the native API; the root is shaped like one vLLM server "
               "(its RL routes, and the disk and LoRA routes RL frameworks call), driving the whole fleet. Errors "
               "are `{\"error\": {\"code\", \"message\", \"field\"?}}`; bad input is answered before any worker is "
               "called. Mutating routes need the token (Bearer, or Basic with the token as the password); with "
               "`api.auth_reads` reads do too, except `/healthz`, `/readyz`, `/health` and this document.")


def controller_document(*, auth_reads: bool, version: str = "0.1.0") -> dict[str, Any]:
    return build_document(ROUTES, title="rl-controlplane API", version=version, description=DESCRIPTION,
                          auth_reads=auth_reads)

"""The agent admin API, declared once: the OpenAPI document at `GET /openapi.json` and the
list the tests hold the registered routes to (`agents.openapi.route_drift`).

Request models are the wire models the handlers parse (`agents.wire`); the small answers of
vLLM's route shapes, which the handlers build as dicts, are described by the models here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from agents.openapi import Route, build_document, openapi_route
from agents.wire import (AbortRequestsRequest, AgentState, DesiredVersionRequest, DiskUpdateRequest,
                         FinishWeightUpdateRequest, InitWeightTransferRequest, LoraInfo, LoraLoadRequest, PauseQuery,
                         UpdateWeightsRequest, UpdateWeightVersionRequest, WeightCheckerRequest, WorldSizeQuery)


class StatusAnswer(BaseModel):
    status: str


class MessageAnswer(BaseModel):
    message: str


class IsPausedAnswer(BaseModel):
    is_paused: bool


class AbortedAnswer(BaseModel):
    status: Literal["aborted"]
    aborted: int = Field(description="Requests aborted.")


class VersionSetAnswer(BaseModel):
    success: Literal[True]
    new_version: str


class WeightInfoAnswer(BaseModel):
    weight_version: str | None


class WorldSizeAnswer(BaseModel):
    world_size: int


class ChecksumsAnswer(BaseModel):
    checksums: dict[str, str] = Field(description="Per tensor, a checksum of its values.")


class CompareAnswer(BaseModel):
    match: bool
    mismatches: list[str] = Field(description="Tensors whose checksum differs from the baseline.")


class DiskUpdatedAnswer(BaseModel):
    status: Literal["updated"]
    weight_version: str | None


class UnloadedAnswer(BaseModel):
    status: Literal["unloaded"]
    name: str
    engine_adapter_ids: list[int] = Field(description="Adapter ids the engine still holds.")


class ProbeAnswer(BaseModel):
    status: str
    reason: str | None = None


# The engine answers every primitive under a deadline: 502 it failed, 503 it is dead, 504 too slow;
# 409 another mutating operation is running.
_ENGINE = (409, 502, 503, 504)
_VLLM, _EXTRA = "vLLM RL routes", "agent"

ROUTES: tuple[Route, ...] = (
    Route("POST", "/pause", "Pause generation: abort, wait (drain) or keep (freeze) in-flight requests.",
          query=PauseQuery, ok=StatusAnswer, errors=_ENGINE, tag=_VLLM),
    Route("POST", "/resume", "Resume generation; frozen requests continue.", ok=StatusAnswer, errors=_ENGINE,
          tag=_VLLM),
    Route("GET", "/is_paused", "Whether generation is paused.", ok=IsPausedAnswer, tag=_VLLM),
    Route("POST", "/abort_requests", "Abort the named requests, or all of them.", body=AbortRequestsRequest,
          body_optional=True, ok=AbortedAnswer, errors=_ENGINE, tag=_VLLM),
    Route("POST", "/init_weight_transfer_engine", "Join the trainer's weight-transfer group.",
          body=InitWeightTransferRequest, ok=MessageAnswer, errors=_ENGINE, tag=_VLLM),
    Route("POST", "/start_weight_update", "Open a weight update.", ok=MessageAnswer, errors=_ENGINE, tag=_VLLM),
    Route("POST", "/update_weights", "Receive one update chunk (or a list) over the group.",
          body=UpdateWeightsRequest, ok=MessageAnswer, errors=_ENGINE, tag=_VLLM),
    Route("POST", "/finish_weight_update", "Close the update; name the weights; drop the prefix cache.",
          body=FinishWeightUpdateRequest, body_optional=True, ok=MessageAnswer, errors=_ENGINE, tag=_VLLM),
    Route("POST", "/shutdown_weight_transfer_engine", "Leave the weight-transfer group.", ok=MessageAnswer,
          errors=_ENGINE, tag=_VLLM),
    Route("POST", "/update_weight_version", "Name the weights the engine holds.", body=UpdateWeightVersionRequest,
          ok=VersionSetAnswer, errors=_ENGINE, tag=_VLLM),
    Route("GET", "/weight_info", "The weight version.", ok=WeightInfoAnswer, tag=_VLLM),
    Route("GET", "/get_world_size", "Inference ranks behind this engine.", query=WorldSizeQuery,
          ok=WorldSizeAnswer, tag=_VLLM),
    Route("POST", "/weight_checker", "Weight checksums: compute, reset, or compare with a baseline.",
          body=WeightCheckerRequest, ok=StatusAnswer | ChecksumsAnswer | CompareAnswer, errors=_ENGINE, tag=_VLLM),
    Route("GET", "/v1/agent/state", "Everything a controller needs from this agent, in one read.", ok=AgentState,
          tag=_EXTRA),
    Route("POST", "/v1/agent/weights/disk", "Reload every weight from a safetensors directory and name them.",
          body=DiskUpdateRequest, ok=DiskUpdatedAnswer, errors=(403, *_ENGINE), tag=_EXTRA),
    Route("POST", "/v1/agent/loras", "Load an adapter, or hot-swap the one under its name.", body=LoraLoadRequest,
          ok=LoraInfo, errors=(403, *_ENGINE), tag=_EXTRA),
    Route("DELETE", "/v1/agent/loras/{name}", "Remove an adapter from the engine (404 if none is loaded).",
          ok=UnloadedAnswer, errors=_ENGINE, path_params={"name": {"type": "string", "minLength": 1}}, tag=_EXTRA),
    Route("PUT", "/v1/agent/desired", "The fleet's desired weight version (readiness follows it).",
          body=DesiredVersionRequest, ok=AgentState, tag=_EXTRA),
    Route("GET", "/healthz", "Liveness: 200 while the engine is alive.", ok=ProbeAnswer, answers={503: ProbeAnswer},
          probe=True, tag="probes"),
    Route("GET", "/readyz", "Readiness: 503 with the reason while not ready.", ok=ProbeAnswer,
          answers={503: ProbeAnswer}, probe=True, tag="probes"),
    Route("GET", "/metrics", "Prometheus metrics.", ok=str, media_type="text/plain", tag="probes"),
    openapi_route(),
)

DESCRIPTION = ("The admin port of one agent (one vLLM engine). The root routes take and answer what vLLM's RL "
               "routes do; `/v1/agent/*` are this project's extras. Errors are `{\"error\": {\"code\", \"message\", "
               "\"field\"?}}`. Mutating routes need the token (Bearer, or Basic with the token as the password); "
               "with `admin.auth_reads` reads do too, except `/healthz`, `/readyz` and this document.")


def agent_document(*, auth_reads: bool, version: str = "0.1.0") -> dict[str, Any]:
    return build_document(ROUTES, title="rl-agent admin API", version=version, description=DESCRIPTION,
                          auth_reads=auth_reads)

"""What an agent reports: `GET /v1/agent/state` (one read tells a controller everything), its
operation records, and the small answers of its probes and of vLLM's `/get_world_size`."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from rlcp.core.wire.base import LenientQuery

OperationKind = Literal[
    "pause",
    "resume",
    "abort_requests",
    "update_weights_from_disk",
    "load_lora",
    "unload_lora",
    "update_weight_version",
    "init_weight_transfer",
    "start_weight_update",
    "update_weights",
    "finish_weight_update",
    "shutdown_weight_transfer",
    "weight_checker",
    "set_desired",
    "sleep",
    "wake_up",
    "reset_prefix_cache",
]


OperationStatus = Literal["ok", "error", "timeout", "cancelled"]


class RequestCounts(BaseModel):
    running: int = 0
    waiting: int = 0
    frozen: int = Field(0, description="Requests held in the engine by a keep-mode pause.")


class LoraInfo(BaseModel):
    name: str
    version: str | None = None
    path: str
    adapter_id: int
    loaded_at: datetime


class OperationRecord(BaseModel):
    id: str
    kind: OperationKind
    status: OperationStatus
    started_at: datetime
    duration_s: float
    message: str | None = None


class AgentState(BaseModel):
    """Everything a controller needs from one agent, read in one call."""

    agent_id: str
    instance_id: str = Field(description="Random per agent process: a new value means the agent restarted.")
    model: str
    engine: Literal["vllm", "sim"]
    engine_alive: bool
    ready: bool
    not_ready_reason: str | None = None
    paused: bool
    sleeping: bool = Field(
        False,
        description="The engine is asleep (`POST /sleep` at level 1 or 2, not yet fully "
        "woken): its memory is released, it serves nothing, and it reports not ready.",
    )
    requests: RequestCounts
    weight_version: str | None
    desired_weight_version: str | None = None
    loras: list[LoraInfo] = Field(default_factory=list)
    lora_enabled: bool | None = Field(
        None, description="The engine was started with LoRA support (`--enable-lora`); None: not reported."
    )
    max_loras: int | None = Field(
        None,
        description="Adapters the engine holds at once (`--max-loras`); vLLM evicts the oldest past it, "
        "silently. None: not reported, or LoRA off.",
    )
    world_size: int
    busy_with: OperationKind | None = Field(None, description="The mutating operation running now, if any.")
    last_operations: list[OperationRecord] = Field(default_factory=list)
    inference_url: str | None = None


class WorldSizeQuery(LenientQuery):
    include_dp: bool = True


class StatusAnswer(BaseModel):
    status: str


class MessageAnswer(BaseModel):
    message: str


class WorldSizeAnswer(BaseModel):
    world_size: int


class ProbeAnswer(BaseModel):
    status: str
    reason: str | None = None

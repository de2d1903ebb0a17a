"""What every mutating route answers and the operations log keeps: an operation's record, a
result per worker, a weight update's waves and its bubble (`GET /v1/rl/operations`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

ResultStatus = Literal["ok", "error", "timeout", "skipped"]


OperationKind = Literal[
    "pause",
    "resume",
    "update_weights",
    "load_lora",
    "unload_lora",
    "reconcile",
    "engine",
    "sleep",
    "wake_up",
    "weight_transfer_init",
    "weight_transfer_update",
    "weight_transfer_shutdown",
    "reset_prefix_cache",
]


# `interrupted`: the operation did not end (the controller stopped, or lost leadership, while it
# ran); its steps' effects are whatever the workers were left with, which the reconciler converges.
OperationStatus = Literal["running", "ok", "partial", "failed", "interrupted"]


class OperationsQuery(BaseModel):
    limit: int = Field(64, ge=1, le=64, description="How many operations, newest first.")


class WorkerResult(BaseModel):
    worker_id: str
    status: ResultStatus
    phase: str = Field(description="The step this result belongs to (pause, update, verify, resume, ...).")
    duration_s: float = 0.0
    message: str | None = None
    code: str | None = Field(
        None,
        description="Why it failed, stable for programs: `timeout`, `unreachable`, "
        "`connection_lost`, `rejected` (or the worker's own error code, e.g. "
        "`path_unavailable`, `path_forbidden`, `conflict`), `verify_failed`, `internal`. "
        "Null when ok.",
    )


class WorkerOutage(BaseModel):
    worker_id: str
    out_of_service_s: float = Field(description="Time outside the gateway's serving set during the operation.")
    returned: bool = Field(description="Back in service when the operation ended.")


class CapacityPoint(BaseModel):
    t_s: float = Field(description="Seconds since the operation started.")
    serving: int = Field(description="Members in service from then on.")


class BubbleReport(BaseModel):
    """How much of the fleet served through an update (the "bubble")."""

    members: int
    serving_at_start: int
    min_serving: int
    mean_capacity: float = Field(description="Time-weighted fraction of the members in service over the operation.")
    worker_seconds_out: float = Field(description="Sum over members of their time out of service.")
    capacity: list[CapacityPoint] = Field(description="Members in service over the operation: a step function.")
    workers: list[WorkerOutage]


class RollProgress(BaseModel):
    strategy: Literal["all_at_once", "rolling"]
    max_unavailable: int = Field(description="Members out of service at once, resolved to a count.")
    waves: int
    waves_done: int
    wave: list[str] = Field(description="The members of the wave being updated now.")
    updated: int = Field(description="Members updated, verified and returned so far.")
    failed: int
    halted: str | None = Field(None, description="Why the roll stopped before its last wave, if it did.")


class OperationResult(BaseModel):
    id: str
    kind: OperationKind
    status: OperationStatus
    started_at: datetime
    finished_at: datetime | None = None
    duration_s: float | None = None
    membership_epoch: int
    detail: dict[str, Any] = Field(default_factory=dict, description="Kind-specific: version, mode, ...")
    results: list[WorkerResult] = Field(default_factory=list, description="Per worker, the last step it reached.")
    progress: RollProgress | None = Field(None, description="A weight update's waves.")
    bubble: BubbleReport | None = Field(None, description="A weight update's out-of-service time and capacity.")

"""The desired state: what the fleet should be, persisted so a restarted controller converges to it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.controller.lora import LoraSpec
from rlcp.core.wire.controller.operations import OperationResult
from rlcp.core.wire.controller.sleep import SleepRecord
from rlcp.core.wire.controller.updates import STALENESS_BOUND_MAX, BroadcastSource, Checkpoint, DiskSource
from rlcp.core.wire.versions import VersionName

OPERATIONS_KEPT = 8  # operations the desired state keeps, so a restart still lists them (`DesiredState.operations`)


APPLIED_VERSIONS_KEPT = STALENESS_BOUND_MAX + 1


class DesiredState(BaseModel):
    """What the fleet should be; persisted, so a restarted controller converges to it."""

    weight_version: VersionName | None = None
    weight_source: DiskSource | BroadcastSource | None = Field(None, discriminator="kind")
    checkpoint: Checkpoint | None = Field(None, description="The newest disk copy of weights known to the fleet.")
    loras: dict[str, LoraSpec] = Field(default_factory=dict)
    paused: bool = False
    pause_mode: PauseMode = "keep"
    held: dict[str, PauseMode] = Field(
        default_factory=dict,
        description="Members held paused by a selector-scoped "
        "pause, by worker id, with its mode: kept paused (by the reconciler too, after "
        "a restart) while the rest follow `paused`, until a resume naming them, or a "
        "resume of the whole fleet, releases them.",
    )
    asleep: dict[str, SleepRecord] = Field(
        default_factory=dict,
        description="Members put to sleep (`POST "
        "/v1/rl/sleep`), by worker id: outside the gateway's fence, left alone by "
        "other operations and by the reconciler (which puts a restarted one back "
        "to sleep), until `POST /v1/rl/wake_up` wakes and verifies them.",
    )
    applied_versions: list[VersionName] = Field(
        default_factory=list,
        description="Weight versions in the order the "
        f"controller applied them, newest last (the last {APPLIED_VERSIONS_KEPT}): "
        "the gateway's staleness bound counts back along this list.",
    )
    minted_versions: int = Field(
        0,
        ge=0,
        description="Weight versions the controller has named itself: a broadcast finished without a "
        "version is named `broadcast-<n>`, n one past this count (past any such name already applied), "
        "so the applied version and every answer's version header never go blank.",
    )
    staleness_bound: int = Field(
        0,
        ge=0,
        le=STALENESS_BOUND_MAX,
        description="The gateway may route to a member at "
        "one of the last `staleness_bound` versions before the desired one (0: the desired "
        "only).",
    )
    placement_replicas: int | None = Field(
        None,
        ge=0,
        description="Agents placement keeps running, as last set "
        "through the API; null: placement.ray.replicas from the settings.",
    )
    operations: list[OperationResult] = Field(
        default_factory=list,
        description="The operation running when this "
        "was written (status `running`) and the last ones to end, newest "
        f"first (at most {OPERATIONS_KEPT}; per-worker results only of the "
        "workers that were not ok): written when an operation begins and "
        "when it ends, so a restarted controller lists one it finds running "
        "as `interrupted`. Empty in the state document (see "
        "`last_operation` and `GET /v1/rl/operations`).",
    )
    updated_at: datetime | None = Field(
        None,
        description="When the fleet's target last changed: the moment the controller (and its "
        "gateway's fence) began to hold it, after the write that persists it.",
    )

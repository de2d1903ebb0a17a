"""`GET /v1/rl/state`: the one document a trainer reads to decide its next step and an operator
reads to see what is wrong (docs/controller.md, "`/v1/rl/state`"); the member reads; the list
of fleets."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from rlcp.core.labels import MAX_SELECTOR_CHARS
from rlcp.core.wire.agent.state import RequestCounts
from rlcp.core.wire.controller.desired import DesiredState
from rlcp.core.wire.controller.operations import (
    BubbleReport,
    OperationResult,
    OperationStatus,
    RollProgress,
    WorkerResult,
)
from rlcp.core.wire.controller.transfer import TransferGroupView

Phase = Literal[
    "serving", "pausing", "paused", "updating", "verifying", "resuming", "degraded", "failed", "sleeping", "waking"
]


PauseState = Literal["running", "paused", "mixed"]


class SelectorQuery(BaseModel):
    """A read of the members, narrowed by label."""

    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A Kubernetes label selector (`role=policy`, "
        "`tier in (a,b)`, `!canary`, comma = AND): only matching members are shown.",
    )


class AppliedState(BaseModel):
    weight_version: str | None = Field(description="The version every member reports, or null when they disagree.")
    converged: bool = Field(description="Every member is at the desired version and LoRAs.")
    verified: bool = Field(description="The last update was verified (versions and, where supported, checksums).")


class UpdateView(BaseModel):
    """The running weight update, else the last one: its progress and its bubble."""

    operation_id: str
    status: OperationStatus
    version: str | None
    progress: RollProgress | None
    bubble: BubbleReport | None


class WorkerView(BaseModel):
    id: str
    admin_url: str
    inference_url: str | None
    flavor: str
    world_size: int
    labels: dict[str, str] = Field(default_factory=dict, description="The member's labels, from its source.")
    reachable: bool
    ready: bool
    serving: bool = Field(description="Reachable, ready, at the desired state, not paused and not cordoned.")
    cordoned: bool = Field(
        False,
        description="Taken out of the gateway's serving set by the controller (a weight "
        "update's wave, or a member asleep) until it has been updated or "
        "woken, and verified.",
    )
    paused: bool | None
    held: bool = Field(False, description="Held paused by a selector-scoped pause (`desired.held`).")
    sleeping: bool = Field(
        False,
        description="Asleep: kept so by the controller (`desired.asleep`), or reported so "
        "by the worker. Out of the gateway's fence (`cordoned`) until woken and verified.",
    )
    requests: RequestCounts | None
    weight_version: str | None
    loras: dict[str, str | None]
    lora_enabled: bool | None = Field(None, description="Its engine has LoRA on; None: its flavor does not say.")
    max_loras: int | None = Field(
        None, description="Adapters its engine holds at once; a load past it is refused (409). None: not known."
    )
    engine_alive: bool | None = Field(None, description="The engine's own liveness, as the worker reports it.")
    not_ready_reason: str | None = None
    last_result: WorkerResult | None = None
    last_seen: datetime | None = None
    last_error: str | None = None


class GatewayWorkerView(BaseModel):
    worker_id: str
    in_fence: bool = Field(description="May be sent a request now (serving, at an allowed version).")
    in_flight: int
    routed: int = Field(description="Requests sent to it since the gateway started.")
    failed: int = Field(description="Requests it failed before (retried elsewhere) or after the first byte.")
    circuit: Literal["closed", "open", "half_open"] = Field(
        "closed",
        description="Outlier detection: closed (in rotation), open (ejected after failing requests in a "
        "row, until `back_in_s`), half_open (its backoff is over: the next request probes it).",
    )
    consecutive_failures: int = Field(0, description="Requests it failed in a row.")
    ejections: int = Field(0, description="Times it was ejected since the gateway started.")
    back_in_s: float | None = Field(None, description="Open: seconds until a request may probe it again.")


class GatewayView(BaseModel):
    """The inference gateway: one endpoint for the fleet's rollouts, fenced by weight version."""

    url: str | None = Field(description="Where the gateway serves, as it bound.")
    allowed_versions: list[str] = Field(description="Versions the fence admits now, desired first.")
    staleness_bound: int
    held: int = Field(description="Requests waiting for a member to serve.")
    routed: int
    rejected: int = Field(description="Answered 503 after their hold deadline (or a full queue).")
    max_in_flight_per_worker: int | None = Field(None, description="The admission limit per worker (None: none).")
    workers: list[GatewayWorkerView]


class EnvoyView(BaseModel):
    """One Envoy connected to the controller's xDS server (or that was: kept until it reconnects)."""

    node: str = Field(description="The Envoy's node id (its `--service-node` or bootstrap `node.id`).")
    connected: bool
    acked_version: str | None = Field(description="The last fence version it acknowledged (applied).")
    sent_version: str | None = Field(description="The last fence version it was sent.")
    nacked: str | None = Field(None, description="Why it refused the last version sent, if it did.")
    acked_at: datetime | None = None


class EnvoyPlaneView(BaseModel):
    """Envoy as the gateway's data plane: the fence the controller serves it over xDS."""

    xds_url: str | None = Field(description="Where the controller's xDS (ADS, gRPC) server listens.")
    fence_version: str = Field(description="The fence's current version, as sent to every Envoy.")
    ack_timeout_s: float = Field(description="How long an update waits for every Envoy's ACK before pausing.")
    envoys: list[EnvoyView]


class FleetSummary(BaseModel):
    """One fleet of a controller, as `GET /v1/rl/fleets` lists it (docs/controller.md, "Fleets")."""

    name: str = Field(description="`default`, or a name from settings `fleets`.")
    path: str = Field(
        description="Where its API is served: `` for the default fleet (the root), else "
        "`/fleets/<name>`; a trainer's admin base URL for it is the controller's plus this."
    )
    selector: str | None = Field(
        description="Its members' label selector; null for the default fleet (every member no named fleet matches)."
    )
    models: list[str] = Field(description="Model names the gateway routes to it.")
    members: int
    serving: int = Field(description="Members inside its fence now.")
    phase: Phase
    pause_state: PauseState
    desired_version: str | None
    applied: AppliedState


class FleetsListing(BaseModel):
    fleets: list[FleetSummary] = Field(description="The default fleet first, then the named ones in settings order.")


class FleetState(BaseModel):
    fleet: str = Field(
        "default",
        description="Which fleet this is: `default`, or a name from settings `fleets` "
        "(served under `/fleets/<name>/`).",
    )
    models: list[str] = Field(
        default_factory=list,
        description="The model names the gateway routes to this fleet: "
        "its settings' `models`, its members' base models, the adapters it keeps or they have.",
    )
    phase: Phase
    quiesced: bool = Field(description="Every member is paused and none has a request running.")
    pause_state: PauseState
    requests: RequestCounts
    sleeping: int = Field(
        0,
        description="Members asleep (out of service on purpose: not counted against `applied.converged` or the phase).",
    )
    desired: DesiredState
    applied: AppliedState
    membership_epoch: int
    discovery_synced: bool
    last_operation: OperationResult | None
    update: UpdateView | None = Field(None, description="The running weight update, else the last one.")
    weight_transfer: TransferGroupView | None = None
    gateway: GatewayView | None = Field(None, description="The inference gateway in this process, if it runs.")
    envoy: EnvoyPlaneView | None = Field(
        None,
        description="Envoy as the data plane (`gateway.data_plane: envoy`): "
        "the fence version and each Envoy's last acknowledged one.",
    )
    workers: list[WorkerView]

"""Wire models of the controller's native API: requests, results, and `/v1/rl/state`.

`FleetState` is the one document a trainer reads to decide its next step and an
operator reads to see what is wrong (docs/controller.md, "`/v1/rl/state`"). Request bodies forbid unknown
fields, so a typo is a 422 naming the field before any worker is touched.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationInfo, field_validator

from rlcp.core.labels import MAX_SELECTOR_CHARS
from rlcp.core.wire.agent import PauseMode, RequestCounts
from rlcp.core.wire.versions import VersionName

Phase = Literal[
    "serving", "pausing", "paused", "updating", "verifying", "resuming", "degraded", "failed", "sleeping", "waking"
]
PauseState = Literal["running", "paused", "mixed"]
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
# The gateway's staleness bound admits at most this many versions before the desired one; the
# desired state keeps one more applied version than that, so every bound has versions to count.
STALENESS_BOUND_MAX = 31
OPERATIONS_KEPT = 8  # operations the desired state keeps, so a restart still lists them (`DesiredState.operations`)
APPLIED_VERSIONS_KEPT = STALENESS_BOUND_MAX + 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests -------------------------------------------------------------------------
class DiskSource(_Body):
    kind: Literal["disk"] = "disk"
    path: str = Field(min_length=1, description="Safetensors directory every worker can read.")


class BroadcastSource(_Body):
    """Weights that arrived over a weight-transfer group (NCCL, or gloo on CPU)."""

    kind: Literal["broadcast"] = "broadcast"


class Checkpoint(_Body):
    """A disk copy of a weight version: what a worker that missed a broadcast loads."""

    path: str = Field(min_length=1)
    version: VersionName


class AllAtOnce(_Body):
    """Every member at once: one pause, one load, one resume (the whole fleet is out of
    service for the update)."""

    type: Literal["all_at_once"] = "all_at_once"


class Rolling(_Body):
    """Waves of at most `max_unavailable` members: each wave leaves the gateway's serving set,
    is updated and verified, and returns before the next one leaves; the others keep serving
    (at the version the staleness bound admits)."""

    type: Literal["rolling"] = "rolling"
    max_unavailable: (
        Annotated[int, Field(strict=True, ge=1, le=100_000)] | Annotated[str, Field(pattern=r"^(100|[1-9][0-9]?)%$")]
    ) = Field(
        1,
        description="Members out of service at once: a count, or a percentage of the members "
        "('25%', rounded down, at least 1).",
    )


UpdateStrategy = Annotated[AllAtOnce | Rolling, Field(discriminator="type")]


class UpdateWeightsRequest(_Body):
    version: VersionName = Field(description="The new weight version.")
    source: DiskSource
    pause_mode: PauseMode = Field("keep", description="How in-flight requests are paused during the update.")
    verify: bool = Field(True, description="Check every member reports the version and checksums agree.")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of each phase, in seconds.")
    strategy: UpdateStrategy = Field(default_factory=AllAtOnce, description="All members at once, or rolling waves.")
    wait: bool = Field(
        True,
        description="false: answer 202 at once with the running operation; follow it at `GET /v1/rl/operations/{id}`.",
    )
    expected_checksums: dict[str, str] | None = Field(
        None,
        min_length=1,
        description="A manifest of this version's weight checksums, as the workers name them "
        "(`POST /weight_checker` `checksum`): every member is checked against it, not only against the others. "
        "Needs `verify`.",
    )

    @field_validator("expected_checksums")
    @classmethod
    def _manifest_needs_verify(cls, value: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        if value is not None and info.data.get("verify") is False:
            raise ValueError("needs verify: true (a manifest is checked by verification)")
        return value


SELECTOR_FIELD = Field(
    None,
    max_length=MAX_SELECTOR_CHARS,
    description="A Kubernetes label selector (`role=policy`, `tier in "
    "(a,b)`, `!canary`, comma = AND): only the matching members are touched, and held so (paused) "
    "or released (resumed) in the desired state; none matching is a 422.",
)


class PauseRequest(_Body):
    mode: PauseMode = "keep"
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline to quiesce, in seconds.")
    selector: str | None = SELECTOR_FIELD


class SelectorQuery(BaseModel):
    """A read of the members, narrowed by label."""

    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A Kubernetes label selector (`role=policy`, "
        "`tier in (a,b)`, `!canary`, comma = AND): only matching members are shown.",
    )


class EngineRouteRequest(_Body):
    """`POST /v1/rl/engine/{route}`: one allowlisted engine route on one worker, the members a
    selector names, or (neither given) the whole fleet."""

    worker: str | None = Field(None, min_length=1, max_length=253, description="One member, by id.")
    selector: str | None = Field(
        None, max_length=MAX_SELECTOR_CHARS, description="A label selector: the matching members."
    )
    body: dict[str, Any] | None = Field(
        None, description="The JSON body sent to a POST route as it is (none for a GET route)."
    )


# A strict int, not `Literal[1, 2]`: a literal of ints matches `true` and `1.0` (they compare
# and hash equal to 1), so `{"level": true}` would put members to sleep.
SleepLevel = Annotated[int, Field(strict=True, ge=1, le=2, json_schema_extra={"enum": [1, 2]})]
WakeTag = Literal["weights", "kv_cache"]
WORKER_IDS_FIELD = Field(
    None,
    min_length=1,
    max_length=1024,
    description="Members by id (every one must be a "
    "member: an unknown id is a 404 naming it); give this or `selector`, not both.",
)


class SleepRequest(_Body):
    """`POST /v1/rl/sleep`: the members named (by `selector` or `worker_ids`; neither: every
    member) leave the gateway's fence, are put to sleep, and are kept asleep in the desired
    state until `POST /v1/rl/wake_up` wakes and verifies them."""

    level: SleepLevel = Field(
        1,
        description="vLLM's sleep level: 1 offloads the weights to host memory and drops "
        "the KV cache; 2 discards both (the weights are reloaded from the fleet's checkpoint "
        "on wake).",
    )
    mode: Literal["abort", "wait"] = Field(
        "abort",
        description="What happens to requests still running on the "
        "member as it falls asleep (vLLM's sleep `mode`): abort them, or wait "
        "for them to finish (bounded by `timeout_s`).",
    )
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of each member's sleep, in seconds.")
    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A label selector: only the matching members (none matching is a 422).",
    )
    worker_ids: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = WORKER_IDS_FIELD


class WakeUpRequest(_Body):
    """`POST /v1/rl/wake_up`: wake the members named (neither `selector` nor `worker_ids`:
    every sleeping member), verify each, and return those that pass to service."""

    tags: list[WakeTag] | None = Field(
        None,
        min_length=1,
        max_length=2,
        description="vLLM's wake_up `tags`: wake "
        "only these allocations (`weights`, `kv_cache`). A partial wake leaves the "
        "members asleep (out of the fence, not verified); null or both: a full wake.",
    )
    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A label selector: only the matching sleeping members (none matching is a 422).",
    )
    worker_ids: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = WORKER_IDS_FIELD


class ResetPrefixCacheRequest(_Body):
    """`POST /v1/rl/reset_prefix_cache`: every member in service (with `selector`, the matching
    ones) drops its prefix cache."""

    reset_running_requests: StrictBool = Field(
        False,
        description="Preempt running requests so their blocks are "
        "dropped too (vLLM recomputes them); without it a member whose "
        "requests hold blocks fails the reset.",
    )
    reset_external: StrictBool = Field(False, description="Also reset an external (KV-connector) prefix cache.")
    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A label selector: only the matching members (none matching is a 422).",
    )


class OperationsQuery(BaseModel):
    limit: int = Field(64, ge=1, le=64, description="How many operations, newest first.")


class EmptyRequest(_Body):
    """A route that takes no fields: an empty body or `{}`."""


class ResumeRequest(_Body):
    selector: str | None = SELECTOR_FIELD


class LoraRequest(_Body):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/-]+$")
    path: str = Field(min_length=1)
    version: VersionName | None = None
    verify: bool = Field(
        True,
        description="Check the adapter's tensors agree across the workers whose checksums "
        "cover adapters (the agent's).",
    )


class TransferInitRequest(_Body):
    init_info: dict[str, Any] = Field(
        description="The trainer's init info for the workers (vLLM's "
        "WeightTransferInitRequest; for a fleet of SGLang servers, SGLang's group fields: "
        "master_address, master_port, world_size, and optionally backend and group_name). "
        "`world_size` must be 1 + the fleet's inference ranks; the controller sets each "
        "worker's `rank_offset`."
    )


class TransferUpdateRequest(_Body):
    update_info: dict[str, Any] | list[dict[str, Any]] = Field(
        description="One update chunk (or a list), passed to every worker."
    )


class TransferFinishRequest(_Body):
    weight_version: VersionName | None = Field(None, description="Names the new weights on every worker.")
    checkpoint_path: str | None = Field(
        None,
        min_length=1,
        description="A disk copy of these weights, loaded into workers that join before the next init.",
    )


# -- desired state ----------------------------------------------------------------------
class LoraSpec(BaseModel):
    path: str
    version: VersionName | None = None


class SleepRecord(BaseModel):
    """A member kept asleep, and what its wake is checked against."""

    level: SleepLevel
    weight_version: str | None = Field(description="The version it held when it went to sleep.")
    checksums_digest: str | None = Field(
        None,
        description="A digest of its weight checksums taken just before it "
        "slept, where its flavor computes them: a wake at the same version must "
        "give the same digest.",
    )
    since: datetime


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


# -- results ------------------------------------------------------------------------------
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


# -- state ----------------------------------------------------------------------------------
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


class TransferMember(BaseModel):
    worker_id: str
    rank_offset: int
    world_size: int


class TransferGroupView(BaseModel):
    """The weight-transfer group the trainer formed with the fleet (rank 0 is the trainer)."""

    membership_epoch: int = Field(description="The membership it was formed with; another one makes it stale.")
    stale: bool = Field(description="Membership changed since init: the next update is refused (409).")
    world_size: int
    members: list[TransferMember]
    updating: bool = Field(description="Between start_weight_update and finish_weight_update.")
    chunks: int = Field(description="Update chunks received in the current update.")


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


class StalenessRequest(_Body):
    bound: int = Field(
        ge=0, le=STALENESS_BOUND_MAX, description="How many versions before the desired one the gateway may serve."
    )


class PlacementRequest(_Body):
    replicas: int | None = Field(
        ge=0,
        description="Agents to keep placed (at most placement.ray.max_replicas); null "
        "hands the count back to the settings' placement.ray.replicas.",
    )


class PlacementView(BaseModel):
    """What placement keeps and what it last saw (GET/PUT /v1/rl/placement)."""

    kind: Literal["none", "ray"]
    replicas: int | None = Field(description="Agents to keep placed; null when placement.kind is none.")
    replicas_from: Literal["settings", "api"] | None = Field(
        description="Where `replicas` comes from: the settings, or the desired state an API call set."
    )
    max_replicas: int | None = None
    placed: list[str] = Field(
        default_factory=list,
        description="Agent actors alive after the last pass, by name (discovery's members say which of them serve).",
    )
    groups: list[str] = Field(default_factory=list, description="Placement groups after the last pass.")
    leading: bool = Field(description="Only the leader places; a follower's view is what it last saw leading.")
    last_pass_at: datetime | None = None
    last_pass_s: float | None = Field(None, description="How long the last pass took.")
    last_error: str | None = Field(
        None, description="Why the last pass failed (retried at the next interval); null when it succeeded."
    )


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


DesiredState.model_rebuild()  # `operations` names OperationResult, defined after it


# -- GET /v1/models, as the gateway and the facade answer it ------------------------------
class ModelCard(BaseModel):
    """vLLM's model card (members' own cards pass through: `root`, `max_model_len`, ...)."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["model"]
    owned_by: str
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]

"""The `/v1/rl/state` document: a pure function of what the controller knows, and its cache.

`build_state` takes plain data (the desired state, the member records, the running
operation, the weight-transfer group) and returns the document; it does no I/O and reads
no clock, so every rule of it is testable alone. `StateCache` serves the serialized
document and rebuilds it only when the change counter moved: trainers and dashboards poll
it many times a second, while building it for hundreds of members takes milliseconds.

Under an update the counter moves with every worker's answer, so a rebuild is frequent and
must cost what changed, not what the fleet holds: `WorkerViews` keeps each member's view and
its JSON until that member's record changes (its `revision`) or the desired state does, and
the document is spliced from those pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.fleet.convergence import converged
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.core.cached import CachedBody, EntityTags
from rlcp.core.wire.agent import RequestCounts
from rlcp.core.wire.controller import (
    AppliedState,
    DesiredState,
    FleetState,
    OperationResult,
    PauseState,
    Phase,
    TransferGroupView,
    UpdateView,
    WorkerView,
)


@dataclass(frozen=True, kw_only=True)
class FleetFacts:
    """Everything the state document is built from."""

    fleet: str = "default"
    models: list[str] = field(default_factory=list)  # what the gateway routes to this fleet
    desired: DesiredState
    members: list[WorkerRecord]
    membership_epoch: int
    discovery_synced: bool
    phase: Phase | None  # the running operation's phase, if one runs
    operation: OperationResult | None  # the running one, else the last one
    update: UpdateView | None = None  # the running weight update, else the last one
    verified: bool  # the last update verified every member
    transfer: TransferGroupView | None
    views: list[WorkerView] | None = None  # the members' views, if already made (`WorkerViews`)


def worker_view(desired: DesiredState, rec: WorkerRecord) -> WorkerView:
    s = rec.status
    # Asleep as the controller keeps it, or as the worker says (put to sleep by hand): either
    # way out of the fence -- `cordoned`, which the gateway already honours -- until a wake
    # through the API has verified it.
    asleep = rec.id in desired.asleep or bool(s is not None and s.sleeping)
    at_desired = bool(s is not None and converged(desired, s))
    ready = bool(rec.reachable and s is not None and s.ready is not False and at_desired and not asleep)
    reason = None
    if asleep:
        reason = "asleep: POST /v1/rl/wake_up wakes and verifies it"
    elif not rec.reachable:
        reason = rec.last_error or "not reached yet"
    elif s is not None and s.ready is False:
        reason = s.not_ready_reason or "worker reports not ready"
    elif not at_desired:
        reason = f"at weight version {s.weight_version if s else None!r}, desired {desired.weight_version!r}"
    return WorkerView(
        id=rec.spec.id,
        admin_url=rec.spec.admin_url,
        inference_url=rec.spec.inference_url,
        flavor=rec.spec.flavor,
        world_size=rec.world_size,
        labels=dict(rec.spec.labels),
        reachable=rec.reachable,
        ready=ready,
        serving=ready and s is not None and s.paused is False and not rec.cordoned,
        cordoned=rec.cordoned or asleep,
        paused=s.paused if s else None,
        held=rec.id in desired.held,
        sleeping=asleep,
        requests=s.requests if s else None,
        weight_version=s.weight_version if s else None,
        loras=s.loras if s else {},
        lora_enabled=s.lora_enabled if s else None,
        max_loras=s.max_loras if s else None,
        engine_alive=s.engine_alive if s else None,
        not_ready_reason=None if ready else reason,
        last_result=rec.last_result,
        last_seen=rec.last_seen,
        last_error=rec.last_error,
    )


def build_state(facts: FleetFacts) -> FleetState:
    views = facts.views if facts.views is not None else [worker_view(facts.desired, r) for r in facts.members]
    known = [v for v in views if v.reachable and v.paused is not None]
    paused = [v.paused for v in known]
    pause_state: PauseState = "paused" if paused and all(paused) else ("running" if not any(paused) else "mixed")
    counts = [v.requests for v in views if v.requests is not None]
    totals = RequestCounts(
        running=sum(c.running for c in counts),
        waiting=sum(c.waiting for c in counts),
        frozen=sum(c.frozen for c in counts),
    )
    quiesced = bool(views) and all(v.reachable and v.paused for v in views) and totals.running == 0
    # Members asleep are out of service on purpose: the fleet's version, convergence and phase
    # are those of the members awake.
    awake = [v for v in views if not v.sleeping]
    versions = {v.weight_version for v in awake}
    common = versions.pop() if len(versions) == 1 and awake else None
    all_converged = bool(awake) and all(v.ready for v in awake)
    if facts.phase is not None:
        phase: Phase = facts.phase
    elif views and not awake:
        phase = "sleeping"
    elif not awake or not any(v.ready for v in awake):
        phase = "failed"
    elif not all_converged:
        phase = "degraded"
    elif facts.desired.paused and pause_state == "paused":
        phase = "paused"
    else:
        phase = "serving"
    return FleetState(
        fleet=facts.fleet,
        models=facts.models,
        phase=phase,
        quiesced=quiesced,
        pause_state=pause_state,
        requests=totals,
        sleeping=len(views) - len(awake),
        desired=facts.desired.model_copy(update={"operations": []}),  # shown as last_operation, and listed apart
        applied=AppliedState(weight_version=common, converged=all_converged, verified=facts.verified and all_converged),
        membership_epoch=facts.membership_epoch,
        discovery_synced=facts.discovery_synced,
        last_operation=facts.operation,
        update=facts.update,
        weight_transfer=facts.transfer,
        workers=views,
    )


@dataclass(frozen=True, slots=True)
class _Made:
    record: WorkerRecord
    revision: int
    desired: DesiredState
    view: WorkerView
    json: bytes


class WorkerViews:
    """Each member's view and its JSON, made again only when its record or the desired
    state changed (the keeper swaps in a new desired object on every change)."""

    def __init__(self) -> None:
        self._made: dict[str, _Made] = {}

    def views(self, desired: DesiredState, members: list[WorkerRecord]) -> list[WorkerView]:
        made: dict[str, _Made] = {}
        for rec in members:
            m = self._made.get(rec.id)
            if m is None or m.record is not rec or m.revision != rec.revision or m.desired is not desired:
                view = worker_view(desired, rec)
                m = _Made(rec, rec.revision, desired, view, view.model_dump_json().encode())
            made[rec.id] = m
        self._made = made
        return [m.view for m in made.values()]

    def json(self, view: WorkerView) -> bytes:
        m = self._made.get(view.id)
        return m.json if m is not None and m.view is view else view.model_dump_json().encode()


def state_json(state: FleetState, worker_json: Callable[[WorkerView], bytes]) -> bytes:
    """`state.model_dump_json()`, byte for byte, with each worker's JSON from `worker_json`
    (`workers` is the document's last field)."""
    head = state.model_dump_json(exclude={"workers"}).encode()
    return b"".join((head[:-1], b',"workers":[', b",".join(worker_json(w) for w in state.workers), b"]}"))


class StateCache:
    """The serialized document, rebuilt only when the change counter has moved, with its
    entity tag (this cache's instance and the generation) and, once asked for, its gzip copy
    (`rlcp.core.cached`): both are made once per generation, never per request."""

    def __init__(
        self,
        changes: ChangeCounter,
        build: Callable[[], FleetState],
        worker_json: Callable[[WorkerView], bytes] = lambda v: v.model_dump_json().encode(),
    ) -> None:
        self._changes = changes
        self._build = build
        self._worker_json = worker_json
        self.tags = EntityTags()  # random per cache: a restarted controller's tags never match old ones
        self._cached: tuple[int, CachedBody] | None = None

    def etag(self) -> str:
        """The current generation's tag, without building anything."""
        return self.tags.tag(self._changes.generation)

    def body(self) -> CachedBody:
        generation = self._changes.generation
        if self._cached is None or self._cached[0] != generation:
            data = state_json(self._build(), self._worker_json)
            self._cached = (generation, CachedBody(etag=self.tags.tag(generation), data=data))
        return self._cached[1]

    def json(self) -> bytes:
        return self.body().data

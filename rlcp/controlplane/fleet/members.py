"""The members of the fleet and what each was last seen to be.

Pure bookkeeping, no I/O: discovery hands member lists to `apply`, the status observer
hands read outcomes to `observe`, operations and the reconciler read `members()`. A
record's driver is built here, through a factory the composition root passes in, so the
registry knows nothing of transports or flavors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from rlcp.controlplane.discovery.base import Membership, MembershipChange
from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.workers.capabilities import Driver, has
from rlcp.controlplane.workers.fanout import Outcome
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus
from rlcp.core.wire.controller.operations import WorkerResult

log = structlog.get_logger("rlcp.controlplane.fleet.members")
NEVER_TOLD = object()  # "never told a desired version", distinct from None


@dataclass
class WorkerRecord:
    spec: WorkerSpec
    driver: Driver
    status: WorkerStatus | None = None
    reachable: bool = False
    last_seen: datetime | None = None
    last_error: str | None = None
    last_result: WorkerResult | None = None
    told_desired: Any = NEVER_TOLD
    cordoned: bool = False  # out of the gateway's serving set while an update works on it
    revision: int = 0  # moves with every change the state document shows (fleet/view.py caches by it)
    reported_at: float | None = None  # monotonic: when an operation's answer last carried its status
    # Monotonic: since when what is recorded (status or error) is known to hold. A status read
    # sent before it may describe the worker as it was before (see `observe`).
    known_since: float = 0.0
    seen_unpublished: bool = False  # last_seen moved on a read that found nothing new (`publish_seen`)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def tracks_desired(self) -> bool:
        """Gates its own readiness on the desired version (so it is told it)."""
        return has(self.driver, "desired_version")

    @property
    def world_size(self) -> int:
        if self.status is not None and self.status.world_size:
            return self.status.world_size
        return self.spec.world_size


class FleetRegistry:
    def __init__(self, *, make_driver: Callable[[WorkerSpec], Driver], changes: ChangeCounter) -> None:
        self._make_driver = make_driver
        self._changes = changes
        self.membership = Membership()
        self._records: dict[str, WorkerRecord] = {}

    def apply(self, specs: list[WorkerSpec]) -> MembershipChange | None:
        """Replace the member list (a discovery report)."""
        self._changes.bump()  # the first list marks discovery synced, even an unchanged one
        change = self.membership.apply(specs)
        if change is None:
            return None
        for spec in change.removed:
            self._records.pop(spec.id, None)
        for spec in (*change.added, *change.changed):
            self._records[spec.id] = WorkerRecord(spec=spec, driver=self._make_driver(spec))
        log.info(
            "membership_changed",
            epoch=change.epoch,
            added=[s.id for s in change.added],
            removed=[s.id for s in change.removed],
            changed=[s.id for s in change.changed],
        )
        return change

    def members(self) -> list[WorkerRecord]:
        return [self._records[k] for k in sorted(self._records)]

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._records.get(worker_id)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._records

    def ids(self) -> set[str]:
        return set(self._records)

    def observe(self, outcome: Outcome[WorkerStatus], *, reported: bool = False, sent_at: float | None = None) -> None:
        """A status read's outcome: reachable with a fresh status, or unreachable and why.
        `reported`: the status came in an operation's answer, so the status observer need
        not read this worker again this interval. `sent_at` (monotonic): when the read was
        sent; None for what an operation's answer says, known now.

        A read sent before what is recorded was known is dropped: it may have been answered
        before an operation's pause, load or resume that is already recorded, and landing
        after it would take the worker back to how it was (paused, or on the old weights: out
        of the fence for no reason, or in it while paused) until the next read. (A status poll
        sent just before an update's resume was seen landing after it, every cycle.)

        A read that finds nothing new (the same status, or the same failure) moves only the
        record's `last_seen`, and not the change counter: the state document, its entity tag
        and the gateway's routes stay as they were, and readers polling with `If-None-Match`
        get 304s until something changes. `publish_seen` shows those last_seen times in one
        change (as Kubernetes' kubelet reports an unchanged NodeStatus only every few
        minutes and heartbeats apart)."""
        rec = self._records.get(outcome.worker_id)
        if rec is None:
            return  # removed while the call was in flight
        if sent_at is not None and sent_at < rec.known_since:
            return  # older than what is recorded
        rec.known_since = sent_at if sent_at is not None else time.monotonic()
        if outcome.ok and outcome.value is not None:
            if reported:
                rec.reported_at = time.monotonic()
            if rec.reachable and rec.status == outcome.value:
                rec.last_seen, rec.seen_unpublished = datetime.now(UTC), True
                return
            if rec.status is not None and outcome.value.instance_id != rec.status.instance_id:
                # A restarted worker remembers nothing we told it.
                rec.told_desired = NEVER_TOLD
                log.info("worker_restarted", worker_id=rec.id)
            if not rec.reachable:
                log.info("worker_reachable", worker_id=rec.id)
            rec.status, rec.reachable = outcome.value, True
            rec.last_seen, rec.last_error = datetime.now(UTC), None
        else:
            if not rec.reachable and rec.last_error == outcome.result.message:
                return  # still unreachable, for the same reason
            if rec.reachable or rec.last_seen is None and rec.last_error is None:
                log.warning("worker_unreachable", worker_id=rec.id, error=outcome.result.message)
            rec.reachable, rec.last_error = False, outcome.result.message
        rec.revision += 1
        rec.seen_unpublished = False
        self._changes.bump()

    def publish_seen(self) -> int:
        """Show in the state document the `last_seen` of every read that found nothing new
        since the last call, as one change; returns how many records moved."""
        moved = 0
        for rec in self._records.values():
            if rec.seen_unpublished:
                rec.seen_unpublished = False
                rec.revision += 1
                moved += 1
        if moved:
            self._changes.bump()
        return moved

    def note_paused(self, worker_id: str, paused: bool) -> None:
        """What a pause or resume the worker answered ok made of it, known before any status
        read (a stock vLLM server says it only when asked). A flavor that cannot report its
        pause state (None) is left so: its next read would take it back."""
        rec = self._records.get(worker_id)
        if rec is None or rec.status is None or rec.status.paused is None:
            return
        rec.known_since = time.monotonic()  # a read sent before this answer may say otherwise
        if rec.status.paused == paused:
            return
        rec.status = rec.status.model_copy(update={"paused": paused})
        rec.revision += 1
        self._changes.bump()

    def record_result(self, result: WorkerResult) -> None:
        """The last step a worker went through, in an operation or a reconcile pass."""
        rec = self._records.get(result.worker_id)
        if rec is not None:
            rec.last_result = result
            rec.revision += 1
            self._changes.bump()

    def cordon(self, worker_ids: list[str], cordoned: bool = True) -> None:
        """Take workers out of the gateway's serving set (or return them), at once: an update
        cordons a wave before pausing it, so no new rollout is sent to a worker about to stop."""
        for worker_id in worker_ids:
            rec = self._records.get(worker_id)
            if rec is not None and rec.cordoned != cordoned:
                rec.cordoned = cordoned
                rec.revision += 1
        self._changes.bump()

    def told(self, worker_id: str, version: str | None) -> None:
        rec = self._records.get(worker_id)
        if rec is not None:
            rec.told_desired = version

"""Bookkeeping of fleet operations: one operation's per-worker results (`OperationTracker`),
and the log of the running one, its phase and the recent ones (`OperationLog`).

A weight update also keeps its progress (waves) and its bubble (`bubble.py`), shown in its
record and in the state document's `update` section.

Each worker's entry is the last step it reached: a worker that failed to pause shows
the pause error, one that went all the way shows its resume result. The operation's
status follows: ok (every worker ok), partial, or failed (none ok). Every change bumps the
fleet's change counter, so the state document shows it at once.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import structlog

from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.metrics import ControllerMetrics
from rlcp.controlplane.operations.bubble import BubbleRecorder
from rlcp.controlplane.workers.fanout import Outcome
from rlcp.core.wire.controller import (
    OperationKind,
    OperationResult,
    OperationStatus,
    Phase,
    RollProgress,
    UpdateView,
    WorkerResult,
)

log = structlog.get_logger("rlcp.controlplane.operations")


class OperationTracker:
    def __init__(
        self, kind: OperationKind, *, epoch: int, changes: ChangeCounter, detail: dict[str, Any] | None = None
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.kind = kind
        self.epoch = epoch
        self._changes = changes
        self._detail = dict(detail or {})
        self.started_at = datetime.now(UTC)
        self._t0 = time.perf_counter()
        self._results: dict[str, WorkerResult] = {}
        self.finished: OperationResult | None = None
        self.progress: RollProgress | None = None
        self._bubble: BubbleRecorder | None = None

    def measure_bubble(self, members: list[str], serving: set[str]) -> BubbleRecorder:
        """Keep the bubble of an update over `members` (those in `serving` in service when it
        began): the operation fills it, the record reports it."""
        self._bubble = BubbleRecorder(members, serving)
        return self._bubble

    @property
    def results(self) -> dict[str, WorkerResult]:
        """Per worker, the last step it reached (read-only: write through the methods)."""
        return dict(self._results)

    @property
    def detail(self) -> dict[str, Any]:
        return dict(self._detail)

    def note(self, **detail: Any) -> None:
        self._detail.update(detail)
        self._changes.bump()

    def record(self, outcomes: Iterable[Outcome[Any]]) -> None:
        for outcome in outcomes:
            self._results[outcome.worker_id] = outcome.result
        self._changes.bump()

    def set_progress(self, progress: RollProgress) -> None:
        self.progress = progress
        self._changes.bump()

    def set_result(self, result: WorkerResult) -> None:
        self._results[result.worker_id] = result
        self._changes.bump()

    def skip(self, worker_id: str, phase: str, message: str) -> None:
        self.set_result(WorkerResult(worker_id=worker_id, status="skipped", phase=phase, message=message))

    def ok_so_far(self, worker_id: str) -> bool:
        result = self._results.get(worker_id)
        return result is None or result.status == "ok"

    def snapshot(self) -> OperationResult:
        if self.finished is not None:
            return self.finished
        return OperationResult(
            id=self.id,
            kind=self.kind,
            status="running",
            started_at=self.started_at,
            membership_epoch=self.epoch,
            detail=dict(self._detail),
            results=sorted(self._results.values(), key=lambda r: r.worker_id),
            progress=self.progress,
            bubble=self._bubble.report() if self._bubble else None,
        )

    def finish(self, *, interrupted: str | None = None) -> OperationResult:
        """`interrupted`: why it did not run to its end (it was cancelled); its status says so."""
        oks = [r.status in ("ok", "skipped") for r in self._results.values()]
        status: OperationStatus = "ok" if all(oks) else ("partial" if any(oks) else "failed")
        if interrupted is not None:
            status = "interrupted"
            self._detail["interrupted"] = interrupted
        self.finished = OperationResult(
            id=self.id,
            kind=self.kind,
            status=status,
            started_at=self.started_at,
            finished_at=datetime.now(UTC),
            duration_s=round(time.perf_counter() - self._t0, 6),
            membership_epoch=self.epoch,
            detail=dict(self._detail),
            results=sorted(self._results.values(), key=lambda r: r.worker_id),
            progress=self.progress,
            bubble=self._bubble.report() if self._bubble else None,
        )
        self._changes.bump()
        return self.finished


class OperationLog:
    """The running operation and its phase, the recent ones, and whether the last update
    verified every member."""

    def __init__(self, *, changes: ChangeCounter, metrics: ControllerMetrics, keep: int = 64) -> None:
        self._changes = changes
        self._metrics = metrics
        self.current: OperationTracker | None = None
        self.phase: Phase | None = None
        self.last: OperationResult | None = None
        self.history: deque[OperationResult] = deque(maxlen=keep)  # newest last
        self.last_update: OperationResult | None = None
        self.verified = False

    def begin(self, kind: OperationKind, *, epoch: int, detail: dict[str, Any]) -> OperationTracker:
        self.current = OperationTracker(kind, epoch=epoch, changes=self._changes, detail=detail)
        self._changes.bump()
        return self.current

    def set_phase(self, phase: Phase | None) -> None:
        self.phase = phase
        self._changes.bump()

    def set_verified(self, verified: bool) -> None:
        self.verified = verified
        self._changes.bump()

    def restore(self, kept: list[OperationResult]) -> None:
        """Operations a previous run of the controller kept in the desired state (newest first),
        into the history behind any this process has (those it knows already are skipped)."""
        known = {op.id for op in self.history}
        older = [op for op in reversed(kept) if op.id not in known]
        if not older:
            return
        self.history = deque([*older, *self.history], maxlen=self.history.maxlen)
        if self.last is None:
            self.last = self.history[-1]
        if self.last_update is None:
            self.last_update = next((op for op in reversed(self.history) if op.kind == "update_weights"), None)
        self._changes.bump()

    def close(self, tracker: OperationTracker, *, interrupted: str | None = None) -> OperationResult:
        """Finish the record: the result joins the history, the phase clears."""
        result = tracker.finish(interrupted=interrupted)
        if self.current is tracker:
            self.current = None
        self.last = result
        if result.kind == "update_weights":
            self.last_update = result
        self.history.append(result)
        self.set_phase(None)
        self._metrics.operation_finished(result.kind, result.status, result.duration_s or 0)
        log.info(
            "operation",
            status=result.status,
            duration_s=result.duration_s,
            failed=[r.worker_id for r in result.results if r.status in ("error", "timeout")],
        )
        return result

    def running_or_last(self) -> OperationResult | None:
        return self.current.snapshot() if self.current is not None else self.last

    def find(self, operation_id: str) -> OperationResult | None:
        if self.current is not None and self.current.id == operation_id:
            return self.current.snapshot()
        return next((op for op in reversed(self.history) if op.id == operation_id), None)

    def update_view(self, shown: OperationResult | None = None) -> UpdateView | None:
        """The running weight update, else the last one. `shown`: the record of the running (or
        last) operation, if already made: its bubble report is not made twice."""
        op = self.last_update
        if self.current is not None and self.current.kind == "update_weights":
            op = shown if shown is not None and shown.id == self.current.id else self.current.snapshot()
        if op is None:
            return None
        return UpdateView(
            operation_id=op.id,
            status=op.status,
            version=op.detail.get("version"),
            progress=op.progress,
            bubble=op.bubble,
        )

    def recent(self, limit: int) -> list[OperationResult]:
        """Newest first, the running one included."""
        ops = [self.current.snapshot()] if self.current is not None else []
        ops += reversed(self.history)
        return ops[:limit]

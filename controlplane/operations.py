"""Bookkeeping of one fleet operation: its id, timing and per-worker results.

Each worker's entry is the last step it reached: a worker that failed to pause shows
the pause error, one that went all the way shows its resume result. The operation's
status follows: ok (every worker ok), partial, or failed (none ok).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from controlplane.fanout import Outcome
from controlplane.state import OperationKind, OperationResult, WorkerResult


class OperationTracker:
    def __init__(self, kind: OperationKind, *, epoch: int, detail: dict[str, Any] | None = None) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.kind = kind
        self.epoch = epoch
        self.detail = detail or {}
        self.started_at = datetime.now(UTC)
        self._t0 = time.perf_counter()
        self.results: dict[str, WorkerResult] = {}
        self.finished: OperationResult | None = None

    def record(self, outcomes: Iterable[Outcome[Any]]) -> None:
        for outcome in outcomes:
            self.results[outcome.worker_id] = outcome.result

    def skip(self, worker_id: str, phase: str, message: str) -> None:
        self.results[worker_id] = WorkerResult(worker_id=worker_id, status="skipped", phase=phase, message=message)

    def snapshot(self) -> OperationResult:
        if self.finished is not None:
            return self.finished
        return OperationResult(id=self.id, kind=self.kind, status="running", started_at=self.started_at,
                               membership_epoch=self.epoch, detail=self.detail,
                               results=sorted(self.results.values(), key=lambda r: r.worker_id))

    def finish(self) -> OperationResult:
        oks = [r.status in ("ok", "skipped") for r in self.results.values()]
        status = "ok" if all(oks) else ("partial" if any(oks) else "failed")
        self.finished = OperationResult(
            id=self.id, kind=self.kind, status=status, started_at=self.started_at,  # type: ignore[arg-type]
            finished_at=datetime.now(UTC), duration_s=round(time.perf_counter() - self._t0, 6),
            membership_epoch=self.epoch, detail=self.detail,
            results=sorted(self.results.values(), key=lambda r: r.worker_id))
        return self.finished


def http_status(result: OperationResult) -> int:
    """200 all ok (or still running, for a step of an open session); 207 some failed;
    502 none ok. Never 200 with an error inside. A broadcast step is one collective: a
    worker that failed it failed the whole step, so any failure there is 502."""
    if result.status in ("ok", "running"):
        return 200
    if result.status == "partial" and not result.kind.startswith("weight_transfer"):
        return 207
    return 502

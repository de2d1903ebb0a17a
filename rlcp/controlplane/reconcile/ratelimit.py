"""Per-worker retry backoff for the reconciler, kept apart from the worker's record.

After client-go's `ItemExponentialFailureRateLimiter`: each failure of a worker doubles
its delay (with jitter, capped); a success forgets it. The reconciler asks `due` before
acting on a worker, so one that cannot be converged is retried with bounded, growing
backoff, never reloaded in a tight loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable


class WorkerRateLimiter:
    def __init__(
        self,
        *,
        initial_s: float,
        max_s: float,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0),
    ) -> None:
        self._initial_s, self._max_s = initial_s, max_s
        self._clock, self._jitter = clock, jitter
        self._failures: dict[str, int] = {}
        self._not_before: dict[str, float] = {}

    def when(self, worker_id: str) -> float:
        """Record a failure; returns how long the worker is left alone."""
        n = self._failures[worker_id] = self._failures.get(worker_id, 0) + 1
        delay = min(self._max_s, self._initial_s * 2.0 ** (n - 1)) * self._jitter()
        self._not_before[worker_id] = self._clock() + delay
        return delay

    def forget(self, worker_id: str) -> None:
        """A success: the next failure starts from the initial delay again."""
        self._failures.pop(worker_id, None)
        self._not_before.pop(worker_id, None)

    def num_requeues(self, worker_id: str) -> int:
        return self._failures.get(worker_id, 0)

    def due(self, worker_id: str) -> bool:
        return self._clock() >= self._not_before.get(worker_id, 0.0)

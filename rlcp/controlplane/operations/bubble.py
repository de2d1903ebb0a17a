"""The update bubble: who was out of service during an update, for how long, and how much of
the fleet served meanwhile. Plain bookkeeping over a clock; the update says when a worker
leaves service (cordoned, or its version fell outside the fence) and when it returns.

A worker not serving when the update began counts as out from the start: the report tells
what the fleet could serve, not only what the update took away.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from rlcp.core.wire.controller.operations import BubbleReport, CapacityPoint, WorkerOutage

_DIGITS = 4


class BubbleRecorder:
    def __init__(
        self, members: Iterable[str], serving: set[str], clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._clock = clock
        self._t0 = clock()
        self._members = sorted(members)
        self._out_since: dict[str, float] = {m: self._t0 for m in self._members if m not in serving}
        self._out_total: dict[str, float] = dict.fromkeys(self._members, 0.0)
        self._serving_at_start = len(self._members) - len(self._out_since)
        self._points: list[tuple[float, int]] = [(0.0, self._serving_at_start)]

    @property
    def serving(self) -> int:
        return len(self._members) - len(self._out_since)

    def out(self, worker_ids: Iterable[str]) -> None:
        now = self._clock()
        for worker_id in worker_ids:
            if worker_id in self._out_total and worker_id not in self._out_since:
                self._out_since[worker_id] = now
        self._point(now)

    def back(self, worker_ids: Iterable[str]) -> None:
        now = self._clock()
        for worker_id in worker_ids:
            since = self._out_since.pop(worker_id, None)
            if since is not None:
                self._out_total[worker_id] += now - since
        self._point(now)

    def _point(self, now: float) -> None:
        t, serving = now - self._t0, self.serving
        if serving == self._points[-1][1]:
            return
        if t - self._points[-1][0] < 1e-6:  # several changes at one instant: the last one counts
            self._points.pop()
        self._points.append((t, serving))

    def report(self) -> BubbleReport:
        now = self._clock()
        elapsed = now - self._t0
        n = len(self._members)
        # The time-weighted serving count: each step holds until the next one (the last, until now).
        ends = [t for t, _ in self._points[1:]] + [elapsed]
        served = sum(count * (end - t) for (t, count), end in zip(self._points, ends, strict=True))
        mean = (served / (n * elapsed)) if n and elapsed > 0 else (self._serving_at_start / n if n else 0.0)
        outs = {
            m: self._out_total[m] + (now - self._out_since[m] if m in self._out_since else 0.0) for m in self._members
        }
        return BubbleReport(
            members=n,
            serving_at_start=self._serving_at_start,
            min_serving=min(c for _, c in self._points),
            mean_capacity=round(mean, _DIGITS),
            worker_seconds_out=round(sum(outs.values()), _DIGITS),
            capacity=[CapacityPoint(t_s=round(t, _DIGITS), serving=c) for t, c in self._points],
            workers=[
                WorkerOutage(worker_id=m, out_of_service_s=round(outs[m], _DIGITS), returned=m not in self._out_since)
                for m in self._members
            ],
        )


def resolve_max_unavailable(value: int | str, members: int) -> int:
    """A count, or a percentage of the members rounded down (as Kubernetes rounds a
    Deployment's maxUnavailable), never below 1 nor above the members."""
    count = value if isinstance(value, int) else members * int(value.rstrip("%")) // 100
    return max(1, min(count, members))


def waves(worker_ids: list[str], size: int) -> list[list[str]]:
    return [worker_ids[i : i + size] for i in range(0, len(worker_ids), size)]

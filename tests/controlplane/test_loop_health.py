"""The controller's view of its own event loop (`rlcp/controlplane/loopwatch.py`) and the frozen
startup heap (`rlcp/core/heap.py`)."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry, Histogram
from structlog.testing import capture_logs

from rlcp.controlplane.loopwatch import watch_loop_lag
from rlcp.core.heap import YOUNG_THRESHOLD, collector_paused, settle


def histogram() -> Histogram:
    return Histogram("lag_seconds", "test", buckets=(0.01, 0.1, 0.5), registry=CollectorRegistry())


def samples(h: Histogram) -> dict[str, float]:
    return {s.labels.get("le", s.name): s.value for m in h.collect() for s in m.samples if s.name.endswith("_bucket")}


async def test_a_blocked_loop_is_measured_and_logged():
    h = histogram()
    with capture_logs() as logs:
        watcher = asyncio.create_task(watch_loop_lag(h, interval_s=0.02, warn_s=0.15, iterations=3))
        await asyncio.sleep(0.005)  # the probe's first sleep is armed
        time.sleep(0.3)  # the loop is held: the probe wakes ~0.28 s late
        await watcher
    buckets = samples(h)
    assert buckets["+Inf"] == 3
    assert buckets["0.1"] == 2, buckets  # one probe late by more than 100 ms, the others on time
    blocked = [e for e in logs if e["event"] == "event_loop_blocked"]
    assert len(blocked) == 1 and blocked[0]["lag_s"] >= 0.15, logs


async def test_a_free_loop_logs_nothing():
    h = histogram()
    with capture_logs() as logs:
        await watch_loop_lag(h, interval_s=0.01, warn_s=0.25, iterations=5)
    assert samples(h)["+Inf"] == 5
    assert not [e for e in logs if e["event"] == "event_loop_blocked"]


def test_settle_freezes_what_startup_made_and_raises_the_young_threshold():
    before = gc.get_threshold()
    try:
        kept = [{"n": i} for i in range(1000)]  # tracked containers alive at "startup"
        frozen = settle()
        assert frozen >= len(kept) and gc.get_freeze_count() == frozen
        assert gc.get_threshold() == (YOUNG_THRESHOLD, before[1], before[2])
        assert all(not any(o is d for o in gc.get_objects()) for d in kept[:3])  # out of the collector's sight
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_no_collection_runs_while_the_collector_is_paused():
    before = gc.get_threshold()
    try:
        with collector_paused():
            assert not gc.isenabled() and gc.get_freeze_count() > 0
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

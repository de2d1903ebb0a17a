"""The placement loop: leader only, one pass every `interval_s` (or at once when the count to
keep changes), each pass's blocking Ray calls on one thread of their own with a deadline (a Ray
call that hangs must not stall the loop, and Ray driver calls are never made from two threads
at once).

A pass that fails is logged, shown in the status, and retried at the next interval; a follower
does nothing (its leader places). Teardown runs on stop only when configured: the actors are
detached.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

import structlog

from rlcp.controlplane.placement.plan import Placed
from rlcp.controlplane.placement.ray import RayPlacer
from rlcp.controlplane.placement.status import PlacementStatus
from rlcp.controlplane.settings import RayPlacementSettings

log = structlog.get_logger("rlcp.controlplane.placement")
T = TypeVar("T")


class Placer(Protocol):
    """What the loop drives (`RayPlacer`); blocking calls, each run on the loop's thread."""

    def reconcile(self, replicas: int) -> Placed: ...
    def teardown(self) -> None: ...
    def close(self) -> None: ...


async def _call(executor: ThreadPoolExecutor, fn: Callable[[], T], timeout_s: float) -> T:
    return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(executor, fn), timeout_s)


async def run_placement(*, settings: RayPlacementSettings, is_leader: Callable[[], bool],
                        placer: Placer | None = None, status: PlacementStatus | None = None,
                        passes: int | None = None) -> None:
    """Forever (or `passes` times, a test seam): keep `status.replicas()` agents placed."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray-placement")
    if placer is None:
        placer = RayPlacer(settings)
    if status is None:
        status = PlacementStatus(settings, desired=lambda: None)
    done = 0
    try:
        while passes is None or done < passes:
            if is_leader():
                replicas, t0 = status.replicas(), time.monotonic()
                try:
                    placed = await _call(executor, functools.partial(placer.reconcile, replicas),
                                         settings.call_timeout_s)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Ray's errors are many and untyped for us: log, retry
                    error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    status.failed(error, time.monotonic() - t0)
                    log.warning("placement_pass_failed", error=error, replicas=replicas,
                                retry_in_s=settings.interval_s)
                else:
                    status.passed(placed, time.monotonic() - t0)
            done += 1
            await status.wait(settings.interval_s)
    finally:
        if settings.teardown and is_leader():
            with contextlib.suppress(Exception):
                await asyncio.shield(_call(executor, placer.teardown, settings.call_timeout_s))
        with contextlib.suppress(Exception):
            await asyncio.shield(_call(executor, placer.close, settings.call_timeout_s))
        executor.shutdown(wait=False)

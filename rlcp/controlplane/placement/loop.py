"""The placement loop: leader only, one pass every `interval_s` (or at once when the count to
keep changes), each pass's blocking Ray calls on one thread of their own with a deadline (a Ray
call that hangs must not stall the loop, and Ray driver calls are never made from two threads
at once).

A pass that fails is logged, shown in the status, and retried at the next interval; a follower
does nothing (its leader places). Teardown runs on stop only when configured: the actors are
detached. On stop, a pass under way is interrupted at its next wait, then the teardown runs
under `teardown_timeout_s` (a failure or a timeout is logged as an error naming what may be
left), then the driver is closed. The thread is a daemon: a Ray call stuck past its deadline
must not keep the process from exiting (a ThreadPoolExecutor's threads are joined at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

import structlog

from rlcp.controlplane.placement.plan import Placed
from rlcp.controlplane.placement.ray import RayPlacer
from rlcp.controlplane.placement.status import PlacementStatus
from rlcp.controlplane.settings.placement import RayPlacementSettings

log = structlog.get_logger("rlcp.controlplane.placement")
T = TypeVar("T")


class Placer(Protocol):
    """What the loop drives (`RayPlacer`); blocking calls, each run on the loop's thread."""

    def reconcile(self, replicas: int) -> Placed: ...
    def interrupt(self) -> None: ...  # from the event loop's thread; the others run on the placement thread
    def teardown(self) -> None: ...
    def close(self) -> None: ...


CLOSE_TIMEOUT_S = 5.0  # disconnecting the driver on stop


class PlacementThread:
    """One daemon thread running blocking calls in the order they come."""

    def __init__(self, name: str = "ray-placement") -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the caller, whatever it is
                    future.set_exception(exc)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((future, fn))
        return future

    def shutdown(self) -> None:
        """The thread ends after what it was given (a call stuck in Ray ends with the process)."""
        self._queue.put(None)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _call(thread: PlacementThread, fn: Callable[[], T], timeout_s: float) -> T:
    return await asyncio.wait_for(asyncio.wrap_future(thread.submit(fn)), timeout_s)


async def run_placement(
    *,
    settings: RayPlacementSettings,
    is_leader: Callable[[], bool],
    placer: Placer | None = None,
    status: PlacementStatus | None = None,
    passes: int | None = None,
) -> None:
    """Forever (or `passes` times, a test seam): keep `status.replicas()` agents placed."""
    thread = PlacementThread()
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
                    placed = await _call(thread, functools.partial(placer.reconcile, replicas), settings.call_timeout_s)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Ray's errors are many and untyped for us: log, retry
                    error = _describe(exc)
                    status.failed(error, time.monotonic() - t0)
                    log.warning("placement_pass_failed", error=error, replicas=replicas, retry_in_s=settings.interval_s)
                else:
                    status.passed(placed, time.monotonic() - t0)
            done += 1
            await status.wait(settings.interval_s)
    finally:
        await _stop(thread, placer, settings, teardown=settings.teardown and is_leader())


async def _stop(thread: PlacementThread, placer: Placer, settings: RayPlacementSettings, *, teardown: bool) -> None:
    """Interrupt a pass under way, tear down (when asked) within its deadline, close the driver.
    Shielded: a second cancellation (the process's shutdown) does not cut the teardown short."""
    placer.interrupt()
    stuck = False
    if teardown:
        t0 = time.monotonic()
        try:
            await asyncio.shield(_call(thread, placer.teardown, settings.teardown_timeout_s))
        except Exception as exc:  # Ray's errors are many and untyped for us; a timeout is one of them here
            stuck = isinstance(exc, TimeoutError)
            log.error(
                "placement_teardown_failed",
                error=_describe(exc),
                duration_s=round(time.monotonic() - t0, 3),
                timeout_s=settings.teardown_timeout_s,
                namespace=settings.namespace,
                left=f"actors and groups named {settings.name_prefix}*",
            )
    if not stuck:  # a close queued behind a stuck call would only wait out its own deadline
        with contextlib.suppress(Exception):
            await asyncio.shield(_call(thread, placer.close, CLOSE_TIMEOUT_S))
    thread.shutdown()

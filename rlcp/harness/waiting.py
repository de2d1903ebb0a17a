"""Bounded waits: poll for evidence until a deadline, never a bare sleep standing in for a check.

A wait that runs out raises AssertionError naming what it waited for and the last value seen,
so a failing test says what never happened. The deadline is generous on purpose (30 s unless
told): it only ends a wait for an event that will never come, so a slow or loaded machine
never decides a verdict; a child process the wait depends on (`watching`) that dies ends the
wait at once, with its log.

Where a test must bound how long something took (a deadline held, a refusal came "at once"),
`LoopStalls` gives the time the test's own event loop could not run meanwhile, to leave out of
the measurement: on the 2-core CI machine a loop was seen blocked for 4.1 s.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol, Self


class Watched(Protocol):
    """A child process a wait depends on (`rlcp.harness.processes.ChildProcess` is one)."""

    def running(self) -> bool: ...

    def failure(self, what: str) -> BaseException: ...


def _expired(what: str, timeout_s: float, last: Any, error: BaseException | None) -> AssertionError:
    return AssertionError(
        f"timed out after {timeout_s:g}s waiting for {what} (last value: {last!r}"
        + (f", last error: {error!r})" if error else ")")
    )


def _check_alive(watching: Iterable[Watched], what: str) -> None:
    for child in watching:
        if not child.running():
            raise child.failure(f"exited while the test waited for {what}")


async def wait_for(
    probe: Callable[[], Any],
    timeout_s: float = 30.0,
    what: str = "condition",
    *,
    interval_s: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
    watching: Iterable[Watched] = (),
) -> Any:
    """Poll `probe` (sync or async) until it returns something truthy; return that. Exceptions of
    the `tolerate` types count as "not yet" (for example connection errors while a process restarts).
    A child in `watching` that is no longer running ends the wait at once with its own failure."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    error: BaseException | None = None
    watching = tuple(watching)
    while True:
        _check_alive(watching, what)
        try:
            last = probe()
            if inspect.isawaitable(last):
                last = await last
            if last:
                return last
        except tolerate as exc:
            error = exc
        if time.monotonic() > deadline:
            raise _expired(what, timeout_s, last, error)
        await asyncio.sleep(interval_s)


def wait_for_sync(
    probe: Callable[[], Any],
    timeout_s: float = 30.0,
    what: str = "condition",
    *,
    interval_s: float = 0.05,
    watching: Iterable[Watched] = (),
) -> Any:
    """`wait_for` for code without an event loop (process start-up, benchmark set-up)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    watching = tuple(watching)
    while True:
        _check_alive(watching, what)
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise _expired(what, timeout_s, last, None)
        time.sleep(interval_s)


class LoopStalls:
    """How long the running event loop could not run, while the block is open: a probe task asks
    to wake every `interval_s` and adds up how late it woke (the controller's loop-lag probe,
    `rlcp/controlplane/loopwatch.py`, for a test's own loop). An upper bound on a duration then
    reads `took - stalls.s < bound`: the machine's load is left out, what the code waited is not.

        async with LoopStalls() as stalls:
            t0 = time.monotonic()
            ...
        assert time.monotonic() - t0 - stalls.s < 5

    Lateness is counted from the wake-up asked for, so a stall counts up to `interval_s` short (a
    bound checked this way errs strict). Code under test that blocks the loop itself is left out
    too; a test about that measures the lag instead. `s` may be read while the block is open."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self._counted = 0.0
        self._asked: float | None = None  # loop time the probe asked to wake at, while it sleeps
        self._task: asyncio.Task[None] | None = None

    @property
    def s(self) -> float:
        """Seconds the loop could not run so far, the stall under way too (read after a stall,
        before the probe woke from it)."""
        pending = 0.0
        if self._asked is not None:
            pending = max(0.0, asyncio.get_running_loop().time() - self._asked)
        return self._counted + pending

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._asked = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self._counted += max(0.0, loop.time() - self._asked)
            self._asked = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._probe(), name="loop-stalls")
        await asyncio.sleep(0)  # started: a stall from here on is counted
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task is not None
        self._counted, self._asked = self.s, None  # what is read after the block stays put
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

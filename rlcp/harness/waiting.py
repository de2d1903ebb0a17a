"""Bounded waits: poll for evidence until a deadline, never a bare sleep standing in for a check.

A wait that runs out raises AssertionError naming what it waited for and the last value seen,
so a failing test says what never happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def _expired(what: str, timeout_s: float, last: Any, error: BaseException | None) -> AssertionError:
    return AssertionError(
        f"timed out after {timeout_s:g}s waiting for {what} (last value: {last!r}"
        + (f", last error: {error!r})" if error else ")")
    )


async def wait_for(
    probe: Callable[[], Any],
    timeout_s: float = 10.0,
    what: str = "condition",
    *,
    interval_s: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll `probe` (sync or async) until it returns something truthy; return that. Exceptions of
    the `tolerate` types count as "not yet" (for example connection errors while a process restarts)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    error: BaseException | None = None
    while True:
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
    probe: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition", *, interval_s: float = 0.05
) -> Any:
    """`wait_for` for code without an event loop (process start-up, benchmark set-up)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise _expired(what, timeout_s, last, None)
        time.sleep(interval_s)

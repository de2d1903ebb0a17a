"""The gate every operation passes: one mutating operation at a time, a deadline on every
engine call.

A second mutating operation while one runs is refused at once with 409 naming the one
running (`exclusive`); it does not queue, so a caller never waits behind a slow reload
without knowing it. Reads take no part in this: they are answered from state the agent
keeps, never by asking an engine that may be busy.

An engine call (`call`) runs under its deadline, and its failures become the agent's errors:
503 the engine is not alive (the call is not started), 504 past the deadline, 502 the engine
refused or failed (`rlcp/agent/errors.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from rlcp.agent.engine.base import EngineError
from rlcp.agent.errors import DeadlineError, EngineCallError, EngineDeadError
from rlcp.core.errors import ConflictError
from rlcp.core.wire.agent.state import OperationKind

T = TypeVar("T")


# What an engine asleep may still be asked: its memory is released (on an accelerator the
# weights are offloaded or gone), so a resume, a reload, a transfer, an adapter or a checksum
# would run on memory that is not there. Pausing and aborting touch no weights.
WHILE_ASLEEP: frozenset[OperationKind] = frozenset({"sleep", "wake_up", "pause", "abort_requests", "set_desired"})


class EngineGate:
    def __init__(self, alive: Callable[[], bool], asleep: Callable[[], bool] = lambda: False) -> None:
        self._alive = alive
        self._asleep = asleep
        self._busy_with: OperationKind | None = None

    @property
    def busy_with(self) -> OperationKind | None:
        """The mutating operation running now, if any."""
        return self._busy_with

    @asynccontextmanager
    async def exclusive(self, kind: OperationKind) -> AsyncIterator[None]:
        """Hold the gate for one mutating operation; 409 if another holds it."""
        if self._busy_with is not None:
            raise ConflictError(f"operation {self._busy_with} is running; retry when it is done")
        if kind not in WHILE_ASLEEP:
            self.check_awake(kind)
        self._busy_with = kind
        try:
            yield
        finally:
            self._busy_with = None

    def check_awake(self, what: str) -> None:
        """409 while the engine is asleep: `what` needs its memory (a read, such as checksums, too)."""
        if self._asleep():
            raise ConflictError(f"the engine is asleep: {what} needs it awake (POST /wake_up first)")

    async def call(self, awaitable: Awaitable[T], deadline_s: float, what: str) -> T:
        """One engine call under a deadline, its failures mapped to the agent's errors."""
        if not self._alive():
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never started; closing avoids a "never awaited" warning
            raise EngineDeadError("the engine is not alive")
        try:
            async with asyncio.timeout(deadline_s):
                return await awaitable
        except TimeoutError as exc:
            raise DeadlineError(f"{what} did not finish within {deadline_s:g}s") from exc
        except EngineError as exc:
            raise EngineCallError(f"{what} failed: {exc}") from exc

"""One mutating operation at a time, with the reconciler yielding to API calls.

An API operation (a trainer's update, an operator's pause) that finds another API
operation running gets 409 at once. One that finds the reconciler working waits for
it: the reconciler checks `api_waiting` between actions and stops early, so a
trainer's step is not refused because a late worker is being converged.

An API operation's record is kept in the store after its caller has its answer (the write
is off the answer's path): the operation hands the gate that write (`release_after`), the
gate stays held until it lands, and an API operation arriving meanwhile waits for it (within
the same bound as for the reconciler) instead of a 409 -- the operation it would conflict
with is over; only its bookkeeping is not.

A session spans several calls (a broadcast update: start, chunks, finish). While one
is open, only calls that belong to it pass; everything else gets 409 and the
reconciler stays out, since touching a worker mid-session would break the group.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rlcp.controlplane.errors import Conflict


class OperationGate:
    def __init__(self, *, wait_for_reconciler_s: float) -> None:
        self._lock = asyncio.Lock()
        self._holder: str | None = None
        self._api_claimed = False
        self._wait_s = wait_for_reconciler_s
        self._session: str | None = None
        self._handed: asyncio.Task[Any] | None = None  # the holder's closing write, set in its context
        self._closing: asyncio.Task[Any] | None = None  # that write, while the gate waits for it

    @property
    def holder(self) -> str | None:
        return self._holder

    @property
    def session(self) -> str | None:
        return self._session

    def begin_session(self, kind: str) -> None:
        self._session = kind

    def end_session(self) -> None:
        self._session = None

    @property
    def api_waiting(self) -> bool:
        return self._api_claimed and self._holder == "reconcile"

    @asynccontextmanager
    async def api_operation(self, kind: str, *, in_session: bool = False) -> AsyncIterator[None]:
        """`in_session`: a call of the open session (refused when none is open)."""
        if self._session is not None and not in_session:
            raise Conflict(f"a {self._session} session is open; retry when it has finished")
        if in_session and self._session is None:
            raise Conflict(f"no {kind} session is open")
        if self._api_claimed or (self._lock.locked() and self._holder != "reconcile" and self._closing is None):
            raise Conflict(f"operation {self._holder or 'another'} is running; retry when it is done")
        self._api_claimed = True
        try:
            try:
                async with asyncio.timeout(self._wait_s):
                    await self._lock.acquire()
            except TimeoutError as exc:
                waited_for = "reconciliation" if self._holder == "reconcile" else f"{self._holder}'s record"
                raise Conflict(f"{waited_for} did not yield within {self._wait_s:g}s") from exc
            self._holder = kind
            try:
                yield
            finally:
                handed, self._handed = self._handed, None
                if handed is None or handed.done():
                    self._release()
                else:
                    self._closing = handed
                    handed.add_done_callback(lambda _: self._release())
        finally:
            self._api_claimed = False

    def release_after(self, task: asyncio.Task[Any]) -> None:
        """Called by the holder of an API operation before its context ends: the gate stays held
        until `task` (its closing write) is done, and the next API operation waits for it."""
        self._handed = task

    def _release(self) -> None:
        self._holder, self._closing = None, None
        self._lock.release()

    @asynccontextmanager
    async def reconcile_pass(self) -> AsyncIterator[bool]:
        """Yields True with the gate held, or False at once when anything else holds it -- but
        for an operation's closing write, which it waits for: it is over in a moment, and the
        pass then starts from what the operation left."""
        closing = self._closing
        if closing is not None:
            await asyncio.wait({closing}, timeout=self._wait_s)
        if self._lock.locked() or self._api_claimed or self._session is not None:
            yield False
            return
        async with self._lock:
            self._holder = "reconcile"
            try:
                yield True
            finally:
                self._holder = None

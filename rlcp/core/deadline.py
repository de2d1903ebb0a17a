"""A deadline on a call that does not count the time this process's own event loop was held.

`asyncio.timeout(s)` expires `s` seconds after it began, whether or not the loop ran meanwhile.
When the loop itself was held -- a long callback, a garbage collection, a process the kernel did
not schedule (a CPU-throttled container, a loaded machine) -- the timer fires late, and an answer
the worker sent in time may be waiting unread in the socket: the call would be failed for the
caller's stall, not the worker's. A controller that did so marked healthy workers unreachable,
left them out of a broadcast round and aborted updates (a test process's loop held 3.3 s at
load ~15 failed every worker of a round this way).

`timeout(s)` is `asyncio.timeout(s)` whose expiry moves later by as much as its timer fired late,
so only time the loop could run counts against the call. The moves add up to at most `s`: a
call never runs past twice its deadline plus the loop's last lateness, so the deadline holds.

For waits on a worker (its calls, an operation's steps, the gateway's connect to it) only: a
lease's deadlines (`controlplane/leadership/`) must count every second, held or not -- a leader
that was frozen cannot assume it still leads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

# Lateness below this is the loop's ordinary scheduling jitter, not a stall.
TOLERANCE_S = 0.05


class _Expiry:
    """The timer of one `timeout`: at each due time, moved later by the loop's lateness while
    moves are left, else the block's `asyncio.Timeout` expires now."""

    def __init__(self, limit: asyncio.Timeout, seconds: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.limit = limit
        self.moves_left = seconds
        self.handle = self._arm(self.loop.time() + seconds)

    def _arm(self, due: float) -> asyncio.TimerHandle:
        return self.loop.call_at(due, self._check, due)

    def _check(self, due: float) -> None:
        late = self.loop.time() - due
        if late > TOLERANCE_S and self.moves_left > 0:
            # Held past the due time: what arrived meanwhile gets the time the loop lost.
            move = min(late, self.moves_left)
            self.moves_left -= move
            self.handle = self._arm(self.loop.time() + move)
        else:
            self.limit.reschedule(self.loop.time())  # expires now: the block ends with TimeoutError


@asynccontextmanager
async def timeout(seconds: float) -> AsyncIterator[None]:
    """`async with timeout(s):` -- raises TimeoutError as `asyncio.timeout` does, once `s`
    seconds of the loop's running time have passed (see the module's docstring)."""
    async with asyncio.timeout(None) as limit:
        expiry = _Expiry(limit, seconds)
        try:
            yield
        finally:
            expiry.handle.cancel()

"""The harness's waits (rlcp/harness/waiting.py): a wait on a child that died ends with the
child's own failure, not at the deadline; LoopStalls counts the time the loop was blocked."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlcp.harness.waiting import LoopStalls, wait_for, wait_for_sync


class Child:
    def __init__(self, running: bool) -> None:
        self._running = running

    def running(self) -> bool:
        return self._running

    def failure(self, what: str) -> BaseException:
        return RuntimeError(f"child {what}; its log: boom")


async def test_a_wait_on_a_dead_child_ends_with_its_failure_not_the_deadline() -> None:
    # The probe never holds: only the child's death can end this wait before its 30 s deadline,
    # and the error says which ended it (a deadline would raise AssertionError "timed out").
    with pytest.raises(RuntimeError, match="child exited while the test waited for the port file; its log: boom"):
        await wait_for(lambda: False, what="the port file", watching=[Child(running=False)])
    with pytest.raises(RuntimeError, match="exited while the test waited for x"):
        wait_for_sync(lambda: False, what="x", watching=[Child(running=False)])
    assert await wait_for(lambda: 7, watching=[Child(running=True)]) == 7


async def test_loop_stalls_counts_the_time_the_loop_was_blocked() -> None:
    async with LoopStalls() as stalls:
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # the loop cannot run: a stall
        # Counted from when the probe asked to wake, so up to one interval less; read before the
        # probe woke from it: the stall under way counts.
        assert stalls.s >= 0.3 - stalls.interval_s
    assert stalls.s >= 0.3 - stalls.interval_s

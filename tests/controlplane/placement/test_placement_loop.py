"""Placement's loop (rlcp/controlplane/placement/loop.py) with a fake placer, and the start-up
error without Ray: a follower places nothing, a failed pass is retried (and shown), teardown only
when configured and leading, the count comes from the desired state when set and a change wakes
the loop, and a missing `ray` names the extra. On stop: a pass under way is interrupted so the
teardown does not wait behind it, a teardown that hangs is given up at its deadline (logged), and
Ray's failure-signal handler is switched off before `ray` is imported (issue 33)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from rlcp.controlplane.errors import PlacementUnavailable
from rlcp.controlplane.placement.loop import run_placement
from rlcp.controlplane.placement.plan import Group, Placed, plan_placement
from rlcp.controlplane.placement.ray import RayPlacer
from rlcp.controlplane.placement.status import PlacementStatus
from rlcp.controlplane.settings.placement import RayPlacementSettings
from rlcp.harness.waiting import LoopStalls


class FakePlacer:
    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self.fail_first = fail_first
        self.asked: list[int] = []
        self.interrupted = threading.Event()

    def _record(self, what: str) -> None:
        self.calls.append(what)
        self.threads.add(threading.current_thread().name)

    def reconcile(self, replicas: int) -> Placed:
        self._record("reconcile")
        self.asked.append(replicas)
        if self.fail_first and self.calls.count("reconcile") == 1:
            raise RuntimeError("GCS unreachable")
        groups = {Group(0, replicas)} if replicas else set()
        return Placed(plan=plan_placement(replicas, set(), set()), actors=set(range(replicas)), groups=groups)

    def interrupt(self) -> None:
        self.interrupted.set()

    def teardown(self) -> None:
        self._record("teardown")

    def close(self) -> None:
        self._record("close")


def settings(**kw: Any) -> RayPlacementSettings:
    return RayPlacementSettings(**{"address": "127.0.0.1:6379", "interval_s": 0.01, **kw})


async def test_leader_passes_on_a_thread_of_their_own_and_a_failed_pass_is_retried() -> None:
    placer = FakePlacer(fail_first=True)
    seen: list[str | None] = []
    status = PlacementStatus(settings(), desired=lambda: None)
    real_failed = status.failed

    def failed(error: str, duration_s: float) -> None:
        real_failed(error, duration_s)
        seen.append(status.view(leading=True).last_error)

    status.failed = failed  # type: ignore[method-assign]  # watch the status between passes
    await run_placement(settings=settings(), is_leader=lambda: True, placer=placer, status=status, passes=3)
    assert placer.calls == ["reconcile", "reconcile", "reconcile", "close"]
    assert len(placer.threads) == 1 and next(iter(placer.threads)).startswith("ray-placement")
    assert seen == ["RuntimeError: GCS unreachable"]
    view = status.view(leading=True)
    assert view.last_error is None and view.placed == ["rlcp-agent-0"] and view.groups == ["rlcp-agent-group-0-1"]
    assert view.replicas == 1 and view.replicas_from == "settings" and view.last_pass_at is not None


async def test_the_count_comes_from_the_desired_state_once_set_and_a_change_wakes_the_loop() -> None:
    desired: list[int | None] = [None]
    placer = FakePlacer()
    status = PlacementStatus(settings(replicas=2, interval_s=60), desired=lambda: desired[0])
    loop = asyncio.create_task(
        run_placement(settings=status.settings, is_leader=lambda: True, placer=placer, status=status)
    )
    try:
        while not placer.asked:
            await asyncio.sleep(0.01)
        assert placer.asked == [2] and status.view(leading=True).replicas_from == "settings"
        desired[0] = 5
        async with LoopStalls() as stalls:
            t0 = time.monotonic()
            status.wake()
            while len(placer.asked) < 2:
                await asyncio.sleep(0.01)
            assert time.monotonic() - t0 - stalls.s < 30  # not the 60 s interval
        assert placer.asked == [2, 5]
        view = status.view(leading=True)
        assert (view.replicas, view.replicas_from, len(view.placed)) == (5, "api", 5)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_follower_places_nothing_and_never_tears_down() -> None:
    placer = FakePlacer()
    await run_placement(settings=settings(teardown=True), is_leader=lambda: False, placer=placer, passes=3)
    assert placer.calls == ["close"]


async def test_teardown_only_when_configured() -> None:
    placer = FakePlacer()
    await run_placement(settings=settings(teardown=True), is_leader=lambda: True, placer=placer, passes=1)
    assert placer.calls == ["reconcile", "teardown", "close"]
    placer = FakePlacer()
    await run_placement(settings=settings(), is_leader=lambda: True, placer=placer, passes=1)
    assert placer.calls == ["reconcile", "close"]


class StuckPlacer(FakePlacer):
    """A pass that waits (as for a group that cannot be reserved) until interrupted; a teardown
    that hangs when `hang_teardown`."""

    def __init__(self, *, hang_teardown: bool = False) -> None:
        super().__init__()
        self.hang_teardown = hang_teardown
        self.in_pass = threading.Event()

    def reconcile(self, replicas: int) -> Placed:
        self._record("reconcile")
        self.in_pass.set()
        if not self.interrupted.wait(60):
            raise AssertionError("never interrupted")
        raise RuntimeError("interrupted")

    def teardown(self) -> None:
        self._record("teardown")
        if self.hang_teardown:
            threading.Event().wait(60)


async def _stop_during_a_pass(placer: StuckPlacer, **kw: Any) -> float:
    loop = asyncio.create_task(
        run_placement(settings=settings(teardown=True, call_timeout_s=60, **kw), is_leader=lambda: True, placer=placer)
    )
    while not placer.in_pass.is_set():
        await asyncio.sleep(0.01)
    async with LoopStalls() as stalls:  # the time the loop could not run is left out
        t0 = time.monotonic()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        return time.monotonic() - t0 - stalls.s


async def test_a_stop_interrupts_the_pass_under_way_and_tears_down_at_once() -> None:
    placer = StuckPlacer()
    took = await _stop_during_a_pass(placer)
    assert placer.calls == ["reconcile", "teardown", "close"]
    assert took < 5  # not the pass's 60 s deadline


async def test_a_teardown_that_hangs_is_given_up_at_its_deadline_and_logged() -> None:
    placer = StuckPlacer(hang_teardown=True)
    with capture_logs() as logs:
        took = await _stop_during_a_pass(placer, teardown_timeout_s=0.3)
    assert took < 3  # the teardown's deadline; no close queued behind the stuck call
    assert placer.calls == ["reconcile", "teardown"]
    failed = [e for e in logs if e["event"] == "placement_teardown_failed"]
    assert len(failed) == 1 and failed[0]["error"] == "TimeoutError" and failed[0]["timeout_s"] == 0.3
    assert failed[0]["left"] == "actors and groups named rlcp-agent-*"
    # The stuck call holds a daemon thread: it does not keep the process from exiting.
    assert all(t.daemon for t in threading.enumerate() if t.name == "ray-placement")


def test_ray_failure_signal_handler_is_off_before_ray_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", raising=False)
    import ray._private.ray_constants as ray_constants

    monkeypatch.setattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", False)  # `ray` imported first
    RayPlacer(settings())
    assert os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] == "1"
    assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is True


def test_without_ray_the_start_fails_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(PlacementUnavailable, match=r"the `ray` extra"):
        RayPlacer(settings())

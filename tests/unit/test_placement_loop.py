"""Placement's loop (rlcp/controlplane/placement/loop.py) with a fake placer, and the start-up
error without Ray: a follower places nothing, a failed pass is retried, teardown only when
configured and leading, and a missing `ray` names the extra."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from rlcp.controlplane.errors import PlacementUnavailable
from rlcp.controlplane.placement.loop import run_placement
from rlcp.controlplane.placement.ray import RayPlacer
from rlcp.controlplane.settings import RayPlacementSettings


class FakePlacer:
    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self.fail_first = fail_first

    def _record(self, what: str) -> None:
        self.calls.append(what)
        self.threads.add(threading.current_thread().name)

    def reconcile(self) -> None:
        self._record("reconcile")
        if self.fail_first and self.calls.count("reconcile") == 1:
            raise RuntimeError("GCS unreachable")

    def teardown(self) -> None:
        self._record("teardown")

    def close(self) -> None:
        self._record("close")


def settings(**kw: Any) -> RayPlacementSettings:
    return RayPlacementSettings(address="127.0.0.1:6379", interval_s=0.01, **kw)


async def test_leader_passes_on_a_thread_of_their_own_and_a_failed_pass_is_retried() -> None:
    placer = FakePlacer(fail_first=True)
    await run_placement(settings=settings(), is_leader=lambda: True, placer=placer, passes=3)
    assert placer.calls == ["reconcile", "reconcile", "reconcile", "close"]
    assert len(placer.threads) == 1 and next(iter(placer.threads)).startswith("ray-placement")


async def test_a_follower_places_nothing_and_never_tears_down() -> None:
    placer = FakePlacer()
    await run_placement(settings=settings(teardown=True), is_leader=lambda: False, placer=placer,
                        passes=3)
    assert placer.calls == ["close"]


async def test_teardown_only_when_configured() -> None:
    placer = FakePlacer()
    await run_placement(settings=settings(teardown=True), is_leader=lambda: True, placer=placer,
                        passes=1)
    assert placer.calls == ["reconcile", "teardown", "close"]
    placer = FakePlacer()
    await run_placement(settings=settings(), is_leader=lambda: True, placer=placer, passes=1)
    assert placer.calls == ["reconcile", "close"]


def test_without_ray_the_start_fails_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(PlacementUnavailable, match=r"the `ray` extra"):
        RayPlacer(settings())

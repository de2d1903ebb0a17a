"""Update strategies, the bubble report, manifests and detached updates, over real agents
(service and handlers on SimEngine) connected in memory (rlcp/harness/memory.py).

What a rolling update promises: at most `max_unavailable` members out of service at once;
the rest keep serving while a wave is updated; a failed wave stops the roll with the members
not yet reached untouched; later waves are held to what earlier ones verified."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlcp.controlplane.errors import Conflict
from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.controlplane.gateway.fence import fence
from rlcp.controlplane.operations.bubble import BubbleRecorder, resolve_max_unavailable, waves
from rlcp.controlplane.operations.weights import update_weights
from rlcp.core.wire.controller.updates import UpdateWeightsRequest
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import disk_update
from rlcp.harness.memory import MemoryFleet

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def memory_fleet_size() -> int:
    return 4


def rolling(max_unavailable: int | str) -> dict[str, Any]:
    return {"strategy": {"type": "rolling", "max_unavailable": max_unavailable}}


def watch_loads(fleet: MemoryFleet, seen: Callable[[str], None]) -> None:
    """Call `seen(agent id)` whenever an agent's engine begins a disk load."""
    for agent in fleet.agents.values():
        load = agent.engine.load_weights_from_disk

        async def watched(path: Any, _id: str = agent.agent_id, _load: Any = load) -> None:
            seen(_id)
            await _load(path)

        agent.engine.load_weights_from_disk = watched  # type: ignore[method-assign]


async def test_a_rolling_update_takes_one_wave_at_a_time_while_the_rest_serve(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    assert (await update_weights(ctl, disk_update(tmp_path, "v1", 1))).status == "ok"
    await ctl.desired.set_staleness_bound(1)
    during: dict[str, dict[str, Any]] = {}

    def seen(agent_id: str) -> None:
        state = ctl.state()
        during[agent_id] = {
            "paused": sorted(a.agent_id for a in memory_fleet.agents.values() if a.service.paused),
            "in_fence": sorted(w.id for w in fence(state)[1]),
            "cordoned": sorted(w.id for w in state.workers if w.cordoned),
            "wave": state.update.progress.wave if state.update and state.update.progress else None,
        }

    watch_loads(memory_fleet, seen)
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2, **rolling(1)))
    assert result.status == "ok" and all(r.phase == "resume" for r in result.results), result.results
    members = ["w0", "w1", "w2", "w3"]
    for i, worker in enumerate(members):
        # Only the wave is paused and cordoned; every other member is inside the fence: those
        # done at v2, those not reached yet at v1 (the staleness bound admits it).
        assert during[worker]["paused"] == [worker] and during[worker]["cordoned"] == [worker], during
        assert during[worker]["wave"] == [worker]
        assert during[worker]["in_fence"] == [m for m in members if m != worker], during
    assert result.progress is not None and result.progress.model_dump() == {
        "strategy": "rolling",
        "max_unavailable": 1,
        "waves": 4,
        "waves_done": 4,
        "wave": [],
        "updated": 4,
        "failed": 0,
        "halted": None,
    }
    bubble = result.bubble
    assert bubble is not None and bubble.members == 4 and bubble.serving_at_start == 4 and bubble.min_serving == 3
    assert all(w.returned and w.out_of_service_s > 0 for w in bubble.workers)
    assert 0.7 < bubble.mean_capacity < 1.0 and [p.serving for p in bubble.capacity][:2] == [4, 3]
    state = ctl.state()
    assert (
        state.applied.weight_version == "v2" and state.applied.verified and not any(w.cordoned for w in state.workers)
    )
    assert state.update is not None and state.update.operation_id == result.id and state.update.bubble == bubble


async def test_all_at_once_empties_the_serving_set_and_the_report_says_so(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    in_fence: list[list[str]] = []
    watch_loads(memory_fleet, lambda _: in_fence.append([w.id for w in fence(ctl.state())[1]]))
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    assert result.status == "ok" and in_fence == [[]] * 4
    bubble = result.bubble
    assert bubble is not None and bubble.min_serving == 0 and [p.serving for p in bubble.capacity] == [4, 0, 4]
    assert result.progress is not None and result.progress.waves == 1 and result.progress.max_unavailable == 4
    assert bubble.worker_seconds_out == pytest.approx(sum(w.out_of_service_s for w in bubble.workers), abs=1e-3)


async def test_at_staleness_zero_a_roll_keeps_the_old_version_out_of_the_fence(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    assert (await update_weights(ctl, disk_update(tmp_path, "v1", 1))).status == "ok"
    in_fence: dict[str, list[str]] = {}
    watch_loads(memory_fleet, lambda agent_id: in_fence.update({agent_id: [w.id for w in fence(ctl.state())[1]]}))
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2, **rolling("50%")))
    assert result.status == "ok" and result.progress is not None and result.progress.waves == 2
    # Wave 1 (w0, w1) loads while w2, w3 still hold v1, which the fence no longer admits.
    assert in_fence["w0"] == [] and in_fence["w2"] == ["w0", "w1"], in_fence
    assert result.bubble is not None and [p.serving for p in result.bubble.capacity] == [4, 0, 2, 4]


async def test_a_failed_wave_stops_the_roll_and_leaves_the_rest_serving(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    assert (await update_weights(ctl, disk_update(tmp_path, "v1", 1))).status == "ok"
    await ctl.desired.set_staleness_bound(1)
    memory_fleet["w1"].engine.fail_next("load_weights_from_disk")
    for a in memory_fleet.agents.values():
        a.touched.clear()
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2, **rolling(2)))
    assert result.status == "partial"
    by_id = {r.worker_id: r for r in result.results}
    assert by_id["w0"].status == "ok" and by_id["w1"].phase == "update" and by_id["w1"].status == "error"
    assert by_id["w2"].status == by_id["w3"].status == "skipped" and "wave 1 of 2 failed on w1" in by_id["w2"].message
    assert result.progress is not None and result.progress.halted and result.progress.waves_done == 1
    assert result.progress.updated == 1 and result.progress.failed == 1
    # Untouched, still serving v1 inside the fence; w1 stays paused (out of service) for the reconciler.
    assert memory_fleet["w2"].touched == memory_fleet["w3"].touched == []
    assert {w.id for w in fence(ctl.state())[1]} == {"w0", "w2", "w3"}
    assert memory_fleet["w1"].service.paused and memory_fleet["w2"].service.weight_version == "v1"
    assert result.bubble is not None and {w.worker_id: w.returned for w in result.bubble.workers} == {
        "w0": True,
        "w1": False,
        "w2": True,
        "w3": True,
    }
    assert not ctl.state().applied.verified


async def test_a_member_already_out_of_service_goes_first_and_does_not_stop_the_roll(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    assert (await update_weights(ctl, disk_update(tmp_path, "v1", 1))).status == "ok"
    await ctl.desired.set_staleness_bound(1)
    memory_fleet["w1"].engine.kill()  # a dead engine: out of service before the update begins
    await ctl.refresh()
    order: list[str] = []
    watch_loads(memory_fleet, order.append)
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2, **rolling(1)))
    assert result.status == "partial" and result.progress is not None and result.progress.halted is None
    by_id = {r.worker_id: r for r in result.results}
    assert by_id["w1"].status == "error" and all(by_id[w].status == "ok" for w in ("w0", "w2", "w3"))
    assert result.progress.waves == 4 and result.progress.updated == 3 and result.progress.failed == 1
    assert order == ["w0", "w2", "w3"]  # w1's wave came first, and failed before its load
    bubble = result.bubble
    assert bubble is not None and bubble.serving_at_start == 3 and bubble.min_serving == 2


async def test_later_waves_are_held_to_what_earlier_waves_verified(memory_fleet: MemoryFleet, tmp_path: Path) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    # w3 reads other files at the same path (a stale node-local copy), alone in the last wave:
    # a wave of one agrees with itself, so only the earlier waves' agreement can catch it.
    wrong = write_checkpoint(tmp_path / "stale", 3)
    real_load = memory_fleet["w3"].engine.load_weights_from_disk
    memory_fleet["w3"].engine.load_weights_from_disk = lambda path: real_load(wrong)  # type: ignore[method-assign]
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1, **rolling(1)))
    failed = {r.worker_id: r.message for r in result.results if r.status != "ok"}
    assert list(failed) == ["w3"] and "earlier waves agreed on" in (failed["w3"] or ""), result.results


async def test_a_manifest_is_checked_on_every_worker(memory_fleet: MemoryFleet, tmp_path: Path) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    assert (await update_weights(ctl, disk_update(tmp_path, "v1", 1))).status == "ok"
    manifest = await ctl.registry.members()[0].driver.weight_checksums()
    assert manifest
    # Every worker loads the same wrong files: they agree with each other, not with the manifest.
    write_checkpoint(tmp_path / "v2", 3)
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2, expected_checksums=manifest))
    assert result.status == "failed" and all(
        "differ from the manifest of version 'v2'" in (r.message or "") for r in result.results
    ), result.results
    assert result.detail["manifest_tensors"] == len(manifest)
    # The right manifest passes (the v1 files again, under a new name).
    result = await update_weights(
        ctl,
        UpdateWeightsRequest(
            version="v1b", source={"kind": "disk", "path": str(tmp_path / "v1")}, expected_checksums=manifest
        ),
    )
    assert result.status == "ok", result.results
    # A manifest naming a tensor no worker has fails every worker, naming it.
    result = await update_weights(
        ctl,
        UpdateWeightsRequest(
            version="v1c",
            source={"kind": "disk", "path": str(tmp_path / "v1")},
            expected_checksums={**manifest, "dp0:pp0:pcp0:tp0:not.a.tensor": "00"},
        ),
    )
    assert result.status == "failed" and all(
        "missing (dp0:pp0:pcp0:tp0:not.a.tensor)" in (r.message or "") for r in result.results
    ), result.results


async def test_an_update_that_does_not_wait_answers_at_once_and_can_be_followed(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    release = asyncio.Event()
    real = memory_fleet["w0"].engine.load_weights_from_disk

    async def slow_load(path: Any) -> None:
        await release.wait()
        await real(path)

    memory_fleet["w0"].engine.load_weights_from_disk = slow_load  # type: ignore[method-assign]
    started = await update_weights(ctl, disk_update(tmp_path, "v1", 1, wait=False, **rolling(2)))
    assert started.status == "running" and started.finished_at is None
    with pytest.raises(Conflict):  # the gate is held by the detached update
        await update_weights(ctl, disk_update(tmp_path, "v2", 2))
    with pytest.raises(Conflict):  # and one that would not wait hears it too, before any answer
        await update_weights(ctl, disk_update(tmp_path, "v2", 2, wait=False))
    for _ in range(200):
        running = ctl.log.find(started.id)
        if running is not None and running.progress is not None and running.progress.wave:
            break
        await asyncio.sleep(0.01)
    assert running is not None and running.status == "running" and running.progress.wave == ["w0", "w1"]
    assert ctl.state().update is not None and ctl.state().update.status == "running"
    release.set()
    for _ in range(500):
        done = ctl.log.find(started.id)
        if done is not None and done.status != "running":
            break
        await asyncio.sleep(0.01)
    assert done is not None and done.status == "ok" and done.progress.waves_done == 2
    assert ctl.log.find("no-such-operation") is None
    await ctl.detached.close()


def test_max_unavailable_resolves_like_a_deployments() -> None:
    assert resolve_max_unavailable(1, 10) == 1 and resolve_max_unavailable(50, 10) == 10
    assert resolve_max_unavailable("25%", 10) == 2 and resolve_max_unavailable("5%", 10) == 1
    assert resolve_max_unavailable("100%", 7) == 7 and resolve_max_unavailable("30%", 1024) == 307
    assert waves(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]


def test_the_bubble_integrates_capacity_over_time() -> None:
    now = [0.0]
    recorder = BubbleRecorder(["a", "b", "c", "d"], serving={"a", "b", "c"}, clock=lambda: now[0])
    now[0] = 1.0
    recorder.out(["a"])
    now[0] = 3.0
    recorder.back(["a", "d"])
    now[0] = 4.0
    report = recorder.report()
    # 3 serving for 1 s, 2 for 2 s, 4 for 1 s: 11 worker-seconds of 16.
    assert report.mean_capacity == pytest.approx(11 / 16) and report.min_serving == 2
    assert [(p.t_s, p.serving) for p in report.capacity] == [(0.0, 3), (1.0, 2), (3.0, 4)]
    assert {w.worker_id: (w.out_of_service_s, w.returned) for w in report.workers} == {
        "a": (2.0, True),
        "b": (0.0, True),
        "c": (0.0, True),
        "d": (3.0, True),
    }
    assert report.worker_seconds_out == 5.0


def test_admitted_versions_is_the_fence_of_a_roll() -> None:
    assert admitted_versions("v2", ["v0", "v1", "v2"], 0) == ["v2"]
    assert admitted_versions("v2", ["v0", "v1", "v2"], 1) == ["v2", "v1"]

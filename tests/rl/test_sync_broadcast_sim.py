"""The trainer's broadcast push (`rlcp.rl.sync.BroadcastSync`) when the fleet moves under its group.

Real agents on SimEngine and a real in-process controller; the trainer is `BroadcastSync` through
`ControllerWeightSyncClient`, with `rlcp.harness.sim_trainer` standing in for vLLM's trainer
engine (SimEngine joins no collective, so rank 0 of a real one would wait for it forever). A
worker joins, leaves or restarts between the group's init and its update: the controller refuses
the round with a 409 naming the change, and the same push forms the group again and lands the
same version on every current member. The controller's side alone: tests/controlplane/operations/
test_broadcast_sim.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.controller import CTL_TOKEN, PATIENT_WORKER_CALLS
from rlcp.harness.sim_trainer import sim_join
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN
from rlcp.harness.waiting import wait_for
from rlcp.rl.sync import MAX_REFORMS, BroadcastSync, Pushed
from tests.support.fleets import FleetShape, SimFleet

pytestmark = pytest.mark.timeout(120)
MODEL = {"model.embed_tokens.weight": [8, 4], "lm_head.weight": [4, 8]}
Change = Callable[[SimFleet], Awaitable[None]]


@pytest.fixture
def fleet_shape() -> FleetShape:
    # Every test here needs each live member in the round it forms (CI25: w1's read gave up while the
    # loop was held, the round was formed without it, and its kill mid-round failed nothing). The
    # members it stops refuse their calls at once, so nothing waits the 60 s.
    return FleetShape(
        agents=3,
        settings={
            "workers": {"token": AGENT_TOKEN, **PATIENT_WORKER_CALLS},
            "weight_transfer": {"init_timeout_s": 5, "chunk_timeout_s": 5},
        },
    )


@pytest.fixture
async def fleet(sim_fleet: SimFleet) -> SimFleet:
    ctl = sim_fleet.ctl
    await wait_for(lambda: all(r.status and r.status.world_size for r in ctl.ctl.members()), what="world sizes")
    await ctl.wait_settled()
    return sim_fleet


def _specs(fleet: SimFleet, ids: set[str]) -> list[WorkerSpec]:
    return [WorkerSpec(**a.spec()) for a in fleet.agents if a.agent_id in ids]


async def _members(fleet: SimFleet, ids: set[str]) -> None:
    """Discovery now lists `ids`, and each member's status has been read (its instance, its ranks)."""
    fleet.ctl.ctl.apply_membership(_specs(fleet, ids))
    await fleet.ctl.ctl.refresh()
    await wait_for(lambda: {r.id for r in fleet.ctl.ctl.members() if r.status} == ids, what=f"members {ids}")


async def _w2_leaves(fleet: SimFleet) -> None:
    await _members(fleet, {"w0", "w1"})


async def _w2_joins(fleet: SimFleet) -> None:
    await _members(fleet, {"w0", "w1", "w2"})


async def _w1_restarts(fleet: SimFleet) -> None:
    before = fleet.ctl.ctl.registry.get("w1").status.instance_id
    await fleet.agents[1].restart()
    await fleet.ctl.ctl.refresh()
    await wait_for(lambda: fleet.ctl.ctl.registry.get("w1").status.instance_id != before, what="w1's new instance")


# (what happens between init and update, the members the group is formed with first, what the 409 names)
CHANGES: dict[str, tuple[Change, set[str], dict[str, list[str]]]] = {
    "a worker joins": (_w2_joins, {"w0", "w1"}, {"joined": ["w2"], "left": [], "restarted": []}),
    "a worker leaves": (_w2_leaves, {"w0", "w1", "w2"}, {"joined": [], "left": ["w2"], "restarted": []}),
    "a worker restarts": (_w1_restarts, {"w0", "w1", "w2"}, {"joined": [], "left": [], "restarted": ["w1"]}),
}


def _sync(
    fleet: SimFleet, after_init: Callable[[int], None] | None = None, after_start: Callable[[int], None] | None = None
) -> BroadcastSync:
    join = sim_join(after_init=after_init, after_start=after_start)
    return BroadcastSync(fleet.ctl.url, CTL_TOKEN, None, timeout_s=30, join=join)


def _on_loop(loop: asyncio.AbstractEventLoop, work: Awaitable[Any]) -> Any:
    """Run `work` on the test's loop (the controller's and the agents') from the trainer's thread."""
    return asyncio.run_coroutine_threadsafe(work, loop).result(timeout=60)  # type: ignore[arg-type]


async def _inits(fleet: SimFleet) -> list[dict[str, Any]]:
    status, body = await fleet.ctl.call("GET", "/v1/rl/operations?limit=64")
    assert status == 200, body
    return [op for op in reversed(body["operations"]) if op["kind"] == "weight_transfer_init"]


async def _push(sync: BroadcastSync, version: str) -> Pushed:
    try:
        return await sync.push(MODEL, version)
    finally:
        await sync.close()


@pytest.mark.parametrize("name", list(CHANGES))
async def test_a_membership_change_between_init_and_update_re_forms_the_group_once_and_the_push_lands(
    fleet: SimFleet, name: str
) -> None:
    change, first, named = CHANGES[name]
    ctl, loop = fleet.ctl, asyncio.get_running_loop()
    await _members(fleet, first)
    seen: dict[str, Any] = {}

    def after_init(n: int) -> None:
        if n != 1:
            return
        _on_loop(loop, change(fleet))
        # What a trainer without the re-form would get: the round refused, naming who moved;
        # nothing is touched (no pause, no session).
        seen["start"] = _on_loop(loop, ctl.call("POST", "/v1/rl/weight_transfer/start"))
        seen["group"] = _on_loop(loop, ctl.state())["weight_transfer"]

    pushed = await _push(_sync(fleet, after_init), "b1")

    status, body = seen["start"]
    assert (status, body["error"]["code"]) == (409, "membership_changed"), body
    assert {k: body["error"][k] for k in named} == named, body
    assert (seen["group"]["stale"], {k: seen["group"]["change"][k] for k in named}) == (True, named)
    # The same push, the same version, on every member the fleet has now, after exactly one re-form.
    assert pushed.error is None, pushed.error
    assert [{k: getattr(c, k) for k in named} for c in pushed.reformed_for] == [named]
    members = {r.id for r in ctl.ctl.members()}
    assert {a.agent_id: a.service.weight_version for a in fleet.agents if a.agent_id in members} == dict.fromkeys(
        members, "b1"
    )
    inits = await _inits(fleet)
    assert [op["status"] for op in inits] == ["ok", "ok"], inits
    assert {k: inits[1]["detail"]["replaces_stale_group"][k] for k in named} == named
    st = await ctl.state()
    assert st["applied"]["weight_version"] == "b1" and st["pause_state"] == "running"
    assert (st["weight_transfer"]["stale"], st["weight_transfer"]["updating"]) == (False, False)
    assert {m["worker_id"] for m in st["weight_transfer"]["members"]} == members


async def test_a_change_during_the_round_refuses_the_chunk_and_the_push_still_lands(fleet: SimFleet) -> None:
    """Between start and the chunk: the controller ends the update (the fleet resumes) and refuses
    the chunk; the trainer's broadcast fails with its own error, not the 409 (the refusal dies in
    the thread beside it), and the push re-forms from the change the client kept."""
    loop = asyncio.get_running_loop()

    def after_start(n: int) -> None:
        if n == 1:
            _on_loop(loop, _w1_restarts(fleet))

    pushed = await _push(_sync(fleet, after_start=after_start), "b1")

    assert pushed.error is None, pushed.error
    assert [(c.joined, c.left, c.restarted) for c in pushed.reformed_for] == [([], [], ["w1"])]
    assert [a.service.weight_version for a in fleet.agents] == ["b1"] * 3
    assert not any(a.service.paused for a in fleet.agents)
    status, body = await fleet.ctl.call("GET", "/v1/rl/operations?limit=64")
    aborted = [op["detail"].get("aborted") for op in body["operations"] if op["kind"] == "weight_transfer_update"]
    assert aborted == [None, "membership changed during the update: restarted: w1"], aborted  # newest first


@pytest.mark.parametrize("when", ["after the re-form's init", "between its world size and its init"])
async def test_a_second_change_during_the_re_form_gets_one_more_and_the_push_lands(fleet: SimFleet, when: str) -> None:
    """The second change lands while the group forms again: after its init (the next start is
    refused), or after the trainer read the world size and before its init (the init is refused
    for its world size, and the client names who joined from the members that size was of)."""
    loop = asyncio.get_running_loop()

    def after_init(n: int) -> None:
        if n == 1:
            _on_loop(loop, _w2_leaves(fleet))
        elif n == 2 and when == "after the re-form's init":
            _on_loop(loop, _w2_joins(fleet))

    def before_init(n: int) -> None:
        if n == 2 and when == "between its world size and its init":
            _on_loop(loop, _w2_joins(fleet))

    sync = BroadcastSync(
        fleet.ctl.url, CTL_TOKEN, None, timeout_s=30, join=sim_join(before_init=before_init, after_init=after_init)
    )
    pushed = await _push(sync, "b1")

    assert pushed.error is None, pushed.error
    assert [(c.joined, c.left) for c in pushed.reformed_for] == [([], ["w2"]), (["w2"], [])]
    assert [a.service.weight_version for a in fleet.agents] == ["b1"] * 3
    # Every group formed is in the log; an init refused for its world size formed none.
    assert len(await _inits(fleet)) == (3 if when == "after the re-form's init" else 2)


async def test_a_fleet_that_keeps_changing_fails_the_push_naming_every_change(fleet: SimFleet) -> None:
    """Bounded: after MAX_REFORMS re-forms the next change fails the push, loudly, and no
    worker is left paused or in an open update."""
    loop = asyncio.get_running_loop()

    def after_init(n: int) -> None:
        _on_loop(loop, _w2_leaves(fleet) if n % 2 else _w2_joins(fleet))

    pushed = await _push(_sync(fleet, after_init), "b1")

    assert pushed.error is not None and pushed.error.startswith("FleetKeptChanging: "), pushed.error
    assert f"changed {MAX_REFORMS + 1} times while pushing b1" in pushed.error
    assert "left: w2 | joined: w2 | left: w2" in pushed.error
    assert len(pushed.reformed_for) == MAX_REFORMS + 1
    assert len(await _inits(fleet)) == MAX_REFORMS + 1  # no init after the last change: no loop
    st = await fleet.ctl.state()
    assert st["pause_state"] == "running" and st["weight_transfer"]["updating"] is False
    assert not any(a.service.paused for a in fleet.agents)
    assert all(a.service.weight_version != "b1" for a in fleet.agents)


def _landed_on_all_after_one_re_form_for_w2(fleet: SimFleet, pushed: Pushed) -> None:
    """The push landed with one re-form, for w2 joining, and all three members serve its version."""
    assert pushed.error is None, pushed.error
    assert [(c.joined, c.left, c.restarted) for c in pushed.reformed_for] == [(["w2"], [], [])]
    assert [a.service.weight_version for a in fleet.agents] == [pushed.version] * 3


async def test_a_worker_that_joins_during_the_round_lets_it_land_and_the_next_push_re_forms_once(
    fleet: SimFleet,
) -> None:
    """A joiner is not in the group, so it cannot break the collective: the open round lands on the
    group's members with no re-form, and the next push's start refuses the stale group once (a
    cheap re-form between rounds), after which the joiner takes the broadcast too."""
    await _members(fleet, {"w0", "w1"})
    loop = asyncio.get_running_loop()

    def after_start(n: int) -> None:
        if n == 1:
            _on_loop(loop, _w2_joins(fleet))

    sync = _sync(fleet, after_start=after_start)
    try:
        first = await sync.push(MODEL, "b1")
        assert first.error is None and first.reformed_for == (), (first.error, first.reformed_for)
        assert [a.service.weight_version for a in fleet.agents[:2]] == ["b1", "b1"]
        second = await sync.push(MODEL, "b2")
    finally:
        await sync.close()
    _landed_on_all_after_one_re_form_for_w2(fleet, second)
    assert len(await _inits(fleet)) == 2


async def _update_closed(fleet: SimFleet) -> dict[str, Any]:
    """The round's update record once the controller has closed it."""

    async def closed() -> dict[str, Any] | None:
        status, body = await fleet.ctl.call("GET", "/v1/rl/operations?limit=64")
        assert status == 200, body
        ops = [op for op in body["operations"] if op["kind"] == "weight_transfer_update"]
        return ops[0] if ops and ops[0]["status"] != "running" else None

    return await wait_for(closed, what="the round's update record, closed")


async def test_a_member_killed_mid_round_fails_it_and_the_push_re_forms_once_discovery_unlists_it(
    fleet: SimFleet,
) -> None:
    """A kill refuses nothing: w1 dies between the round's start and its chunk, the chunk fails on it
    (no 409: the group's members are all still listed), the controller ends the update, and the
    trainer's broadcast fails with its own error. Discovery unlists w1 only after that (as a
    listing's next poll or a pod's readiness probe would): the push waits for it, forms the group
    again with w0 and w2, and lands the same version on both."""
    loop = asyncio.get_running_loop()
    unlisted: dict[str, Any] = {}

    async def unlist_once_the_round_failed() -> None:
        unlisted["record"] = await _update_closed(fleet)
        await _members(fleet, {"w0", "w2"})

    def after_start(n: int) -> None:
        if n == 1:
            _on_loop(loop, fleet.agents[1].stop())
            unlisted["task"] = asyncio.run_coroutine_threadsafe(unlist_once_the_round_failed(), loop)

    pushed = await _push(_sync(fleet, after_start=after_start), "b1")

    await asyncio.wrap_future(unlisted["task"])
    assert unlisted["record"]["status"] != "ok", unlisted["record"]  # the kill failed the round itself
    assert [r["worker_id"] for r in unlisted["record"]["results"] if r["status"] != "ok"] == ["w1"]
    assert pushed.error is None, pushed.error
    assert [(c.joined, c.left, c.restarted) for c in pushed.reformed_for] == [([], ["w1"], [])]
    assert [fleet.agents[i].service.weight_version for i in (0, 2)] == ["b1", "b1"]
    assert len(await _inits(fleet)) == 2
    st = await fleet.ctl.state()
    assert st["applied"]["weight_version"] == "b1" and st["pause_state"] == "running"
    assert {m["worker_id"] for m in st["weight_transfer"]["members"]} == {"w0", "w2"}


async def test_a_round_that_fails_with_no_member_gone_fails_the_push_after_the_wait(fleet: SimFleet) -> None:
    """The negative control: w1's engine fails the chunk and every member stays listed. No change
    comes within the wait, so the push fails with the round's error and forms no second group."""
    loop = asyncio.get_running_loop()

    def after_start(n: int) -> None:
        if n == 1:
            loop.call_soon_threadsafe(fleet.agents[1].engine.fail_next, "update_weights", "injected")

    sync = _sync(fleet, after_start=after_start)
    sync.change_wait_s = 1.0  # the change will never come: how long the push looks for it
    pushed = await _push(sync, "b1")

    assert pushed.error is not None and pushed.reformed_for == (), (pushed.error, pushed.reformed_for)
    assert len(await _inits(fleet)) == 1
    assert not any(a.service.weight_version == "b1" for a in fleet.agents)


async def test_a_listed_member_that_does_not_answer_is_left_out_until_it_does(fleet: SimFleet) -> None:
    """w2 is down but still listed (a static list naming a dead worker, a Ray actor restarting, an
    engine still starting): the group is formed with the members that answer, and the push lands
    on them with no re-form. Once w2 answers again, the next push's start counts it as joined:
    one re-form, and it takes the broadcast too (before that the reconciler may converge it)."""
    ctl = fleet.ctl.ctl
    await fleet.agents[2].stop()
    await ctl.refresh()
    await wait_for(lambda: not ctl.registry.get("w2").reachable, what="w2 not answering")
    sync = _sync(fleet)
    try:
        first = await sync.push(MODEL, "b1")
        assert first.error is None and first.reformed_for == (), (first.error, first.reformed_for)
        assert [a.service.weight_version for a in fleet.agents[:2]] == ["b1", "b1"]
        st = await fleet.ctl.state()
        assert {m["worker_id"] for m in st["weight_transfer"]["members"]} == {"w0", "w1"}
        await fleet.agents[2].start()
        await ctl.refresh()
        await wait_for(lambda: ctl.registry.get("w2").reachable, what="w2 answering again")
        second = await sync.push(MODEL, "b2")
    finally:
        await sync.close()
    _landed_on_all_after_one_re_form_for_w2(fleet, second)

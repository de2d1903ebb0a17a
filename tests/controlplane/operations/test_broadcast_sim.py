"""Broadcast weight updates through the controller, against real agents on SimEngine.

The agents are the real agent code (admin routes, service, deadlines); only the engine
is simulated, so these tests cover the controller's side of the protocol: rank
offsets, the session rules, every failure path, and what each worker is left with.
The same path with real vLLM engines and a real trainer is in test_broadcast_vllm.py.
"""

from __future__ import annotations

import asyncio

import pytest

from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import start_controller, update_body
from rlcp.harness.faults import Fault
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import Labelled
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(120)
CHUNK = {"names": ["model.embed_tokens.weight"], "dtype_names": ["float32"], "shapes": [[8, 4]]}


@pytest.fixture
async def broadcast_fleet(tmp_path):
    """Three agents with 1, 2 and 1 inference ranks: the trainer's world size is 5."""
    agents = [
        await SimAgent(f"w{i}", [tmp_path], engine_kwargs={"world_size": size}).start()
        for i, size in enumerate((1, 2, 1))
    ]
    ctl = await start_controller(tmp_path, agents, weight_transfer={"init_timeout_s": 2, "chunk_timeout_s": 2})
    await wait_for(lambda: all(r.status and r.status.world_size for r in ctl.ctl.members()), what="world sizes")
    await ctl.wait_settled()  # the reconciler's first PUT to each agent is not a test's touch
    yield ctl, agents, tmp_path
    await ctl.client.close()
    for a in agents:
        if hasattr(a, "runner"):
            await a.stop()


async def _init(ctl, world_size: int = 5):
    return await ctl.call(
        "POST",
        "/v1/rl/weight_transfer/init",
        {
            "init_info": {
                "master_address": "127.0.0.1",
                "master_port": 29999,
                "rank_offset": 1,
                "world_size": world_size,
            }
        },
    )


def _by_worker(result: dict) -> dict[str, tuple[str, str]]:
    return {r["worker_id"]: (r["status"], r["phase"]) for r in result["results"]}


async def test_a_broadcast_cycle_assigns_ranks_pauses_updates_and_resumes(broadcast_fleet):
    ctl, agents, _ = broadcast_fleet
    status, info = await ctl.call("GET", "/v1/rl/weight_transfer", headers={})
    assert (status, info["inference_world_size"], info["trainer_world_size"], info["group"]) == (200, 4, 5, None)
    assert (info["members"], info["membership_epoch"]) == (["w0", "w1", "w2"], 1)  # what the sizes are of

    status, result = await _init(ctl)
    assert status == 200, result
    # The trainer is rank 0; workers follow in id order, each at the sum of the sizes before it.
    assert [a.engine.transfer.init_info["rank_offset"] for a in agents] == [1, 2, 4]
    assert all(a.engine.transfer.init_info["world_size"] == 5 for a in agents)
    group = (await ctl.state())["weight_transfer"]
    assert group["members"] == [
        {"worker_id": "w0", "rank_offset": 1, "world_size": 1},
        {"worker_id": "w1", "rank_offset": 2, "world_size": 2},
        {"worker_id": "w2", "rank_offset": 4, "world_size": 1},
    ]
    assert (group["stale"], group["updating"]) == (False, False)

    status, result = await ctl.call("POST", "/v1/rl/weight_transfer/start")
    assert (status, result["status"]) == (200, "running"), result
    assert all(a.service.paused for a in agents)  # start pauses a fleet the trainer left running
    st = await ctl.state()
    assert st["phase"] == "updating" and st["weight_transfer"]["updating"]
    for _ in range(2):
        status, result = await ctl.call("POST", "/v1/rl/weight_transfer/update", {"update_info": CHUNK})
        assert status == 200, result
    assert all(a.engine.weight_update_chunks == 2 for a in agents)

    status, result = await ctl.call("POST", "/v1/rl/weight_transfer/finish", {"weight_version": "b1"})
    assert (status, result["status"], result["kind"]) == (200, "ok", "weight_transfer_update"), result
    assert result["detail"]["chunks"] == 2
    for a in agents:
        assert a.service.weight_version == "b1" and not a.service.paused
        assert a.service.desired_weight_version == "b1"
    st = await ctl.state()
    assert st["phase"] == "serving" and st["applied"] == {"weight_version": "b1", "converged": True, "verified": True}
    assert st["desired"]["weight_source"] == {"kind": "broadcast"}
    assert st["weight_transfer"]["updating"] is False


async def test_bad_init_is_refused_before_any_worker_is_touched(broadcast_fleet):
    ctl, agents, _ = broadcast_fleet
    # Each refused call is judged by the worker calls that carried its own request id: what the
    # reconciler does meanwhile (after a status read that gave up under load) is not its doing.
    calls = [
        ({"init_info": {"world_size": 4}}, "/v1/rl/weight_transfer/init", 422, "init_info.world_size"),
        ({"init_info": {}}, "/v1/rl/weight_transfer/init", 422, "init_info.world_size"),
        ({"init_info": {"world_size": "5"}}, "/v1/rl/weight_transfer/init", 422, "init_info.world_size"),
        ({"init": {}}, "/v1/rl/weight_transfer/init", 422, "init_info"),
        # Calls out of order are 409s naming what to do first.
        (None, "/v1/rl/weight_transfer/start", 409, "init_weight_transfer_engine first"),
        ({"update_info": CHUNK}, "/v1/rl/weight_transfer/update", 409, "start_weight_update first"),
    ]
    for body, path, code, says in calls:
        rid = fresh_request_id("refused-transfer")
        status, answer = await ctl.call("POST", path, body, headers=with_request_id(rid))
        assert status == code, (path, answer)
        if code == 422:
            assert answer["error"]["field"] == says, answer
            assert "must be 5" in answer["error"]["message"] or says != "init_info.world_size"
        else:
            assert says in answer["error"]["message"], answer
        assert_no_worker_touched(agents, rid, (path, body))


async def test_an_open_update_excludes_other_operations_and_the_reconciler(broadcast_fleet):
    ctl, agents, tmp_path = broadcast_fleet
    assert (await _init(ctl))[0] == 200
    assert (await ctl.call("POST", "/v1/rl/weight_transfer/start"))[0] == 200
    ckpt = write_checkpoint(tmp_path / "c1", 1)
    for method, path, body in (
        ("POST", "/v1/rl/resume", {}),
        ("POST", "/v1/rl/update_weights", update_body("v", ckpt)),
        ("POST", "/v1/rl/weight_transfer/init", {"init_info": {"world_size": 5}}),
        ("POST", "/v1/rl/weight_transfer/start", {}),
    ):
        status, answer = await ctl.call(method, path, body)
        assert status == 409 and "session is open" in answer["error"]["message"], (path, answer)
    # A worker drifting mid-update (here: resumed behind our back) is left alone until finish.
    touched = [list(a.touched) for a in agents]
    await agents[0].service.control.resume()
    assert await ctl.ctl.reconciler.reconcile_once() == 0
    await asyncio.sleep(0.3)
    assert [a.touched for a in agents] == touched
    status, result = await ctl.call("POST", "/v1/rl/weight_transfer/finish", {"weight_version": "b1"})
    assert status == 200, result


async def test_membership_change_after_init_fails_the_next_update_fast_with_409(broadcast_fleet):
    ctl, agents, _ = broadcast_fleet
    assert (await _init(ctl))[0] == 200
    ctl.ctl.apply_membership([WorkerSpec(**a.spec()) for a in agents[:2]])  # w2 leaves the fleet
    status, body = await ctl.call("POST", "/v1/rl/weight_transfer/start")
    assert (status, body["error"]["code"]) == (409, "membership_changed"), body
    change = {"joined": [], "left": ["w2"], "restarted": [], "group_epoch": 1, "membership_epoch": 2}
    assert {k: body["error"][k] for k in change} == change, body
    assert "left: w2" in body["error"]["message"]
    assert not any(a.service.paused for a in agents)
    group = (await ctl.state())["weight_transfer"]
    assert (group["stale"], group["change"]) == (True, change)
    # Re-initialising with the new world size forms a fresh group; its init names the change it replaced.
    status, result = await _init(ctl, world_size=4)
    assert status == 200 and result["detail"]["replaces_stale_group"] == change, result
    group = (await ctl.state())["weight_transfer"]
    assert (group["stale"], group["change"]) == (False, None)


async def test_a_worker_restarting_during_an_update_aborts_it_with_409_and_the_fleet_resumes(broadcast_fleet):
    ctl, agents, _ = broadcast_fleet
    assert (await _init(ctl))[0] == 200
    assert (await ctl.call("POST", "/v1/rl/weight_transfer/start"))[0] == 200
    await agents[1].restart()  # a new process: it left the group
    await ctl.ctl.refresh()
    status, body = await ctl.call("POST", "/v1/rl/weight_transfer/update", {"update_info": CHUNK})
    assert (status, body["error"]["code"]) == (409, "membership_changed"), body
    assert (body["error"]["joined"], body["error"]["left"], body["error"]["restarted"]) == ([], [], ["w1"]), body
    assert "restarted: w1" in body["error"]["message"]
    # Nothing was sent, so every worker's weights are intact: all serve again.
    await wait_for(lambda: not any(a.service.paused for a in agents), what="fleet resumed")
    last = (await ctl.state())["last_operation"]
    assert last["kind"] == "weight_transfer_update" and "membership changed" in last["detail"]["aborted"]


async def test_a_worker_dying_between_start_and_finish(broadcast_fleet):
    """The chunk fails on the dead worker: the call returns 502 naming it and the phase;
    the survivors end their reload and, since their weights are now unknown, stay
    paused and not ready until the reconciler restores the last disk checkpoint."""
    ctl, agents, tmp_path = broadcast_fleet
    ckpt = write_checkpoint(tmp_path / "c1", 1)
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", ckpt))
    assert status == 200, result
    assert (await _init(ctl))[0] == 200
    assert (await ctl.call("POST", "/v1/rl/weight_transfer/start"))[0] == 200
    await agents[1].stop()
    status, result = await ctl.call("POST", "/v1/rl/weight_transfer/update", {"update_info": CHUNK})
    assert status == 502, result
    by_worker = _by_worker(result)
    assert by_worker["w1"] == ("error", "update_weights[1]")
    assert by_worker["w0"] == by_worker["w2"] == ("ok", "abort:finish_weight_update")
    assert "a worker failed an update chunk" in result["detail"]["aborted"]
    st = await ctl.state()
    assert st["weight_transfer"] is None  # the group is gone: the trainer must init again
    assert st["last_operation"]["id"] == result["id"]
    # The reconciler brings the survivors back to v1 from disk and resumes them.
    await wait_for(
        lambda: all(a.service.weight_version == "v1" and not a.service.paused for a in (agents[0], agents[2])),
        what="survivors restored from disk",
    )
    status, body = await ctl.call("POST", "/v1/rl/weight_transfer/start")
    assert status == 409


async def test_the_trainer_never_joins_init_times_out_and_nothing_is_paused(broadcast_fleet):
    ctl, agents, _ = broadcast_fleet
    for a in agents:
        a.faults["/init_weight_transfer_engine"] = Fault("hang")  # blocked in the rendezvous
    status, result = await _init(ctl)
    assert status == 502, result
    assert {s for s, _ in _by_worker(result).values()} == {"timeout"}
    assert all("/init_weight_transfer_engine did not answer within 2s" in r["message"] for r in result["results"])
    st = await ctl.state()
    assert st["weight_transfer"] is None and st["pause_state"] == "running"
    assert not any(a.service.paused for a in agents)


async def test_one_worker_failing_init_releases_the_others(broadcast_fleet):
    ctl, agents, _ = broadcast_fleet
    agents[2].faults["/init_weight_transfer_engine"] = Fault("status", 502, times=1)
    status, result = await _init(ctl)
    assert status == 502
    assert _by_worker(result) == {
        "w0": ("ok", "shutdown_weight_transfer"),
        "w1": ("ok", "shutdown_weight_transfer"),
        "w2": ("error", "init_weight_transfer"),
    }
    assert agents[0].engine.transfer.init_info is None  # left the half-formed group


async def test_a_trainer_that_goes_quiet_is_aborted_and_the_fleet_resumes(broadcast_fleet, tmp_path):
    ctl, agents, _ = broadcast_fleet
    await ctl.client.close()
    ctl = await start_controller(tmp_path, agents, weight_transfer={"idle_timeout_s": 0.5})
    assert (await _init(ctl))[0] == 200
    assert (await ctl.call("POST", "/v1/rl/weight_transfer/start"))[0] == 200
    assert all(a.service.paused for a in agents)
    await wait_for(lambda: not any(a.service.paused for a in agents), what="fleet resumed after idle abort")
    last = (await ctl.state())["last_operation"]
    assert "no call from the trainer" in last["detail"]["aborted"]
    status, body = await ctl.call("POST", "/v1/rl/weight_transfer/finish", {"weight_version": "late"})
    assert status == 409
    await ctl.client.close()


async def test_a_new_member_is_converged_from_the_last_disk_checkpoint(broadcast_fleet):
    ctl, agents, tmp_path = broadcast_fleet
    ckpt1, ckpt2 = write_checkpoint(tmp_path / "c1", 1), write_checkpoint(tmp_path / "c2", 2)
    assert (await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", ckpt1)))[0] == 200
    for version, checkpoint in (("b2", None), ("b3", str(ckpt2))):
        assert (
            await _init(
                ctl,
                world_size=1
                + sum(r.spec.world_size if not r.status else r.status.world_size for r in ctl.ctl.members()),
            )
        )[0] == 200
        assert (await ctl.call("POST", "/v1/rl/weight_transfer/start"))[0] == 200
        assert (await ctl.call("POST", "/v1/rl/weight_transfer/update", {"update_info": CHUNK}))[0] == 200
        body = {"weight_version": version} | ({"checkpoint_path": checkpoint} if checkpoint else {})
        status, result = await ctl.call("POST", "/v1/rl/weight_transfer/finish", body)
        assert status == 200, result
        newcomer = await SimAgent(f"w9-{version}", [tmp_path]).start()
        agents.append(newcomer)
        ctl.ctl.apply_membership([WorkerSpec(**a.spec()) for a in agents])
        if checkpoint is None:
            # Only v1 is on disk: the newcomer gets it, and stays not ready (desired is b2).
            await wait_for(lambda: newcomer.service.weight_version == "v1", what="newcomer on v1")
            view = ctl.worker(await ctl.state(), newcomer.agent_id)
            assert view["ready"] is False and "desired 'b2'" in view["not_ready_reason"]
        else:
            await wait_for(lambda: newcomer.service.weight_version == "b3", what="newcomer on b3")
            await wait_for(lambda: ctl.ctl.worker_view(ctl.ctl.registry.get(newcomer.agent_id)).ready, what="ready")
    status, body = await ctl.call("POST", "/v1/rl/weight_transfer/finish", {"checkpoint_path": "/etc"})
    assert status == 422 and body["error"]["field"] == "checkpoint_path"


async def test_a_new_leadership_term_forgets_the_group_and_the_open_update(broadcast_fleet):
    """Another replica may have driven the workers meanwhile: nothing from the old term goes on."""
    ctl, agents, _ = broadcast_fleet
    assert (await _init(ctl))[0] == 200
    assert (await ctl.call("POST", "/v1/rl/weight_transfer/start"))[0] == 200
    leadership = ctl.ctl.leadership
    leadership.lost(leader="other", reason="test")
    leadership.acquired()
    await ctl.ctl.ensure_leading()
    st = await ctl.state()
    assert st["weight_transfer"] is None and st["phase"] != "updating"
    assert "new leadership term" in st["last_operation"]["detail"]["aborted"]
    status, body = await ctl.call("POST", "/v1/rl/weight_transfer/update", {"update_info": CHUNK})
    assert status == 409 and "start_weight_update first" in body["error"]["message"]
    assert (await ctl.call("POST", "/v1/rl/resume", {}))[0] == 200  # the gate is free again


async def test_a_broadcast_updates_a_held_member_and_leaves_it_held(tmp_path):
    """A member held paused by a selector-scoped pause takes the broadcast (it is in the group,
    its ranks are the trainer's to fill) but stays paused after the finish, as after a disk
    update; releasing the hold brings it back at the new version."""
    agents = [await SimAgent(f"w{i}", [tmp_path]).start() for i in range(2)]
    ctl = await start_controller(
        tmp_path,
        [Labelled(a, {"role": role}) for a, role in zip(agents, ("policy", "ref"))],
        weight_transfer={"init_timeout_s": 2, "chunk_timeout_s": 2},
    )
    try:
        await wait_for(lambda: all(r.status and r.status.world_size for r in ctl.ctl.members()), what="world sizes")
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep", "selector": "role=ref"})
        assert status == 200, result
        status, result = await _init(ctl, world_size=3)
        assert status == 200, result
        for path, body in (("start", None), ("update", {"update_info": CHUNK}), ("finish", {"weight_version": "b1"})):
            status, result = await ctl.call("POST", f"/v1/rl/weight_transfer/{path}", body)
            assert status == 200, (path, result)
        assert [a.engine.weight_update_chunks for a in agents] == [1, 1]
        assert [(a.service.weight_version, a.service.paused) for a in agents] == [("b1", False), ("b1", True)]
        st = await ctl.state()
        assert st["pause_state"] == "mixed" and st["desired"]["held"] == {"w1": "keep"}
        assert [(w["id"], w["held"], w["serving"]) for w in st["workers"]] == [("w0", False, True), ("w1", True, False)]

        status, result = await ctl.call("POST", "/v1/rl/resume", {"selector": "role=ref"})
        assert status == 200, result
        assert [(a.service.weight_version, a.service.paused) for a in agents] == [("b1", False), ("b1", False)]
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()

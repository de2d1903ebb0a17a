"""Nothing pauses before the weights are known to be there (`operations/checkpoint.py`): a real
controller over real agents on SimEngine, on loopback. A checkpoint no worker can load is a
422 with nothing touched; one some workers cannot load leaves those out, reported per worker
and unharmed; one that appears a moment late is waited for; a file symlinked out of the
allowed roots is refused like a directory would be."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest

from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.controller import start_controller, update_body
from rlcp.harness.http import bearer, call
from rlcp.harness.simfleet import TOKEN, SimAgent, start_fleet
from rlcp.harness.waiting import LoopStalls, wait_for
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(120)


async def settled(ctl) -> None:
    await wait_for(lambda: not any(ctl.ctl.reconciler.needs_work(r) for r in ctl.ctl.members()), what="settled")


def assert_untouched(agents, rid: str, what: object = "") -> None:
    """The request `rid` told, paused or loaded none of `agents` (judged by the calls that carried
    its id: the reconciler's meanwhile are not its own), and none is paused."""
    assert_no_worker_touched(agents, rid, what)
    for a in agents:
        assert not a.service.paused, a.agent_id


async def test_a_checkpoint_no_worker_can_load_is_a_422_with_nothing_touched(tmp_path):
    agents = await start_fleet(3, [tmp_path])
    ctl = await start_controller(tmp_path, agents)
    try:
        status, result = await ctl.call(
            "POST", "/v1/rl/update_weights", update_body("v1", write_checkpoint(tmp_path / "v1", 1))
        )
        assert status == 200, result
        await settled(ctl)
        sharded = write_checkpoint(tmp_path / "sharded", 2)
        (sharded / "model.safetensors.index.json").write_text(
            json.dumps(
                {"weight_map": {"model.embed.weight": "model.safetensors", "x": "model-00002-of-00002.safetensors"}}
            )
        )
        cases = [
            ("a typo", tmp_path / "does-not-exist"),
            ("no weights in it", write_adapter(tmp_path / "adapter")),
            ("a shard not copied yet", sharded),
        ]
        for name, path in cases:
            rid = fresh_request_id("unloadable")
            async with LoopStalls() as stalls:
                t0 = time.monotonic()
                status, resp = await ctl.call(
                    "POST", "/v1/rl/update_weights", update_body("v2", path), headers=with_request_id(rid)
                )
                waited, stalled = time.monotonic() - t0, stalls.s
            assert status == 422, (name, resp)
            err = resp["error"]
            assert err["code"] == "checkpoint_unavailable" and err["field"] == "source.path", (name, err)
            assert set(err["workers"]) == {"w0", "w1", "w2"} and "nothing was touched" in err["message"], err
            # Less the time the loop could not run (as in the late-checkpoint test below).
            assert waited - stalled < 5, ("waited far past checkpoint_wait_s", waited, stalled)
            assert_untouched(agents, rid, name)
        # The vLLM-shaped route answers the same, naming its own field.
        rid = fresh_request_id("unloadable")
        status, resp = await ctl.call(
            "POST", "/update_weights", {"weight_dir": str(tmp_path / "does-not-exist")}, headers=with_request_id(rid)
        )
        assert status == 422 and resp["error"]["field"] == "weight_dir", resp
        assert_untouched(agents, rid, "/update_weights")
        state = await ctl.state()
        assert state["desired"]["weight_version"] == "v1" and state["desired"]["weight_source"]["path"].endswith("v1")
        assert all(w["serving"] and w["weight_version"] == "v1" and not w["paused"] for w in state["workers"])
        assert state["pause_state"] == "running"
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()


async def test_a_checkpoint_some_workers_cannot_load_leaves_them_out_unharmed(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    agents = [await SimAgent(f"w{i}", [tmp_path]).start() for i in range(2)]
    # w2 reads checkpoints from its own storage: the path the others load is not there for it.
    agents.append(await SimAgent("w2", [tmp_path / "elsewhere"]).start())
    ctl = await start_controller(tmp_path, agents)
    try:
        await settled(ctl)
        rid = fresh_request_id("partly-loadable")
        status, result = await ctl.call(
            "POST",
            "/v1/rl/update_weights",
            update_body("v1", write_checkpoint(tmp_path / "v1", 1)),
            headers=with_request_id(rid),
        )
        assert status == 207, result
        by_id = {r["worker_id"]: r for r in result["results"]}
        assert by_id["w2"]["status"] == "error" and by_id["w2"]["phase"] == "check", by_id["w2"]
        assert by_id["w2"]["code"] == "path_forbidden" and "outside the allowed roots" in by_id["w2"]["message"]
        assert by_id["w0"]["status"] == by_id["w1"]["status"] == "ok", result
        assert result["detail"]["checkpoint_refused"] == ["w2"]
        # w2 was never told, paused or loaded: it is where it was, running (the others were, by
        # calls carrying this request's id, as w2 would have been).
        assert_untouched(agents[2:], rid, "w2")
        assert all(a.touched_by(rid) for a in agents[:2]), [a.touched_by(rid) for a in agents]
        assert agents[2].engine.served_version == "default" and agents[2].service.desired_weight_version is None
        assert all(a.engine.served_version == "v1" and not a.service.paused for a in agents[:2])
        state = await ctl.state()
        assert not state["applied"]["verified"]  # one member was left out
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()


async def test_a_checkpoint_that_appears_a_moment_late_is_waited_for(tmp_path):
    agents = await start_fleet(2, [tmp_path])
    ctl = await start_controller(
        tmp_path,
        agents,
        workers={
            "token": "agent-token",
            "timeout_s": 2,
            "attempts": 2,
            "retry_budget_s": 5,
            "pause_timeout_s": 5,
            "weight_load_timeout_s": 10,
            "checkpoint_wait_s": 2,
        },
    )
    try:
        await settled(ctl)
        target = tmp_path / "step-1"

        async def publish_late() -> float:
            await asyncio.sleep(0.8)
            staging = write_checkpoint(tmp_path / ".staging", 1)
            os.rename(staging, target)  # as shared storage shows it: all at once, a moment late
            return time.monotonic()

        t0 = time.monotonic()
        publisher = asyncio.create_task(publish_late())
        status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", target))
        shown_at = await publisher
        assert status == 200, result
        assert time.monotonic() > shown_at and shown_at - t0 >= 0.8
        assert all(a.engine.served_version == "v1" for a in agents)
        # Never there within the wait: refused once the wait is over, nothing touched.
        rid = fresh_request_id("never-there")
        async with LoopStalls() as stalls:  # the controller runs in this loop
            t0 = time.monotonic()
            status, resp = await ctl.call(
                "POST", "/v1/rl/update_weights", update_body("v2", tmp_path / "never"), headers=with_request_id(rid)
            )
            waited, stalled = time.monotonic() - t0, stalls.s
        assert status == 422 and resp["error"]["code"] == "checkpoint_unavailable", resp
        # It looked for the whole wait (2 s less a retry's tick), and stopped after it: the time
        # the loop could not run at all (a loaded machine blocked it 4.1 s once) is no one's wait.
        assert waited >= 1.75 and waited - stalled < 5, (waited, stalled)
        assert_untouched(agents, rid)
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()


async def test_a_file_symlinked_out_of_the_roots_is_refused_like_a_directory(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    write_checkpoint(outside / "ckpt", 7)
    linked = root / "linked"
    linked.mkdir(parents=True)
    (linked / "model.safetensors").symlink_to(outside / "ckpt" / "model.safetensors")
    adapter = write_adapter(root / "adapter")
    (adapter / "adapter_model.safetensors").symlink_to(outside / "ckpt" / "model.safetensors")
    agent = await SimAgent("a0", [root]).start()
    try:
        async with aiohttp.ClientSession() as http:
            for path, body in [
                ("/v1/agent/weights/disk", {"path": str(linked), "version": "x"}),
                ("/v1/agent/weights/update", {"path": str(linked), "version": "x"}),
                ("/v1/agent/weights/check", {"path": str(linked)}),
                ("/v1/agent/loras", {"name": "a", "path": str(adapter)}),
            ]:
                status, resp = await call(http, "POST", agent.url + path, body=body, headers=bearer(TOKEN))
                assert status == 403 and resp["error"]["field"] == "path", (path, resp)
                assert "resolves outside the allowed roots" in resp["error"]["message"], resp
            # prepare with a checkpoint it cannot load changes nothing: no desired version, no pause.
            status, resp = await call(
                http,
                "POST",
                agent.url + "/v1/agent/prepare",
                headers=bearer(TOKEN),
                body={"desired_weight_version": "v9", "weights_path": str(root / "nope")},
            )
            assert status == 400 and resp["error"]["code"] == "path_unavailable", resp
            assert resp["error"]["field"] == "weights_path"
            assert not agent.service.paused and agent.service.desired_weight_version is None
            # ... and neither does the update in one call.
            status, resp = await call(
                http,
                "POST",
                agent.url + "/v1/agent/weights/update",
                headers=bearer(TOKEN),
                body={"version": "v9", "path": str(root / "nope"), "resume": True},
            )
            assert status == 400 and resp["error"]["code"] == "path_unavailable", resp
            assert resp["error"]["field"] == "path"
            assert not agent.service.paused and agent.service.desired_weight_version is None
            assert agent.engine.served_version == "default"
            # A symlink that stays inside the roots is fine.
            write_checkpoint(root / "real", 3)
            inside = root / "inside"
            inside.mkdir()
            (inside / "model.safetensors").symlink_to(root / "real" / "model.safetensors")
            status, resp = await call(
                http, "POST", agent.url + "/v1/agent/weights/check", body={"path": str(inside)}, headers=bearer(TOKEN)
            )
            assert status == 200 and resp["files"] == 1 and resp["tensors"] == 2, resp
    finally:
        await agent.stop()


async def test_an_adapter_no_worker_can_load_is_a_422_and_never_desired(tmp_path):
    agents = await start_fleet(2, [tmp_path])
    ctl = await start_controller(tmp_path, agents)
    try:
        await settled(ctl)
        linked = write_adapter(tmp_path / "linked-adapter")
        (linked / "adapter_model.safetensors").symlink_to("/etc/hostname")  # a file out of the roots
        for body, field in (
            ({"name": "a", "path": str(linked)}, "path"),
            ({"name": "a", "path": str(tmp_path / "no-such-adapter")}, "path"),
            ({"name": "a", "path": str(write_checkpoint(tmp_path / "weights-not-adapter", 1))}, "path"),
        ):
            rid = fresh_request_id("unloadable-adapter")
            status, resp = await ctl.call("POST", "/v1/rl/loras", body, headers=with_request_id(rid))
            assert status == 422 and resp["error"]["code"] == "checkpoint_unavailable", resp
            assert resp["error"]["field"] == field and set(resp["error"]["workers"]) == {"w0", "w1"}, resp
            assert_no_worker_touched(agents, rid, body)
        rid = fresh_request_id("unloadable-adapter")
        status, resp = await ctl.call(
            "POST", "/load_lora_adapter", {"lora_name": "a", "lora_path": str(linked)}, headers=with_request_id(rid)
        )
        assert status == 422 and resp["error"]["field"] == "lora_path", resp
        assert_no_worker_touched(agents, rid, "/load_lora_adapter")
        assert (await ctl.state())["desired"]["loras"] == {}
        assert not ctl.ctl.desired.state.loras
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()

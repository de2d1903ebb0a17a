"""Sleep / wake_up as fleet operations over real agents on SimEngine (admin and OpenAI ports on
loopback) inside a real controller and its gateway: members put to sleep leave the fence at
once and the gateway sends them nothing, the state shows them asleep, other operations and the
reconciler leave them so (a restarted one is put back to sleep; a restarted controller keeps
them asleep), and a wake verifies each before it serves again -- a member that fails stays out,
named with why. Bad input and a flavor without sleep mode are refused before any worker.

SimEngine follows vLLM's accelerator builds here (level 2 loses the weights); what vLLM's CPU
build does with sleep is tests/e2e/test_controller_vllm.py's and
tests/controlplane/workers/flavors/vllm_serve/test_vllm_serve.py's business."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import Ctl, rlctl, start_controller, update_body
from rlcp.harness.simfleet import TOKEN, SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import FleetShape, GatewayFleet

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(agents=3)


async def served_by(fleet: GatewayFleet, n: int = 12) -> set[str]:
    """Who answered `n` requests sent through the gateway at once."""

    async def one() -> str:
        async with fleet.http.post(
            f"{fleet.gateway.url}/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 2}
        ) as resp:
            assert resp.status == 200, await resp.text()
            return resp.headers["X-RL-Worker"]

    return set(await asyncio.gather(*(one() for _ in range(n))))


def in_fence(fleet: GatewayFleet) -> set[str]:
    table = fleet.gateway.router.table()
    return set() if table is None else set(table.routes)


def calls(agent: SimAgent, since: int = 0) -> list[str]:
    """The calls that reached `agent`, but for the reconciler's own: its status reads, and its first
    pass telling the desired version (which may land while a test's request is refused)."""
    return [c for c, *_ in agent.traced[since:] if c not in ("GET /v1/agent/state", "PUT /v1/agent/desired")]


async def test_sleep_leaves_the_fence_and_a_wake_verifies_before_serving(
    gateway_fleet: GatewayFleet, tmp_path: Path
) -> None:
    ctl, agents = gateway_fleet.ctl, {a.agent_id: a for a in gateway_fleet.agents}
    status, result = await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["w1"]})
    assert status == 200, result
    assert result["kind"] == "sleep" and result["detail"] == {
        "level": 1,
        "mode": "abort",
        "worker_ids": ["w1"],
        "workers": ["w1"],
    }
    assert [(r["worker_id"], r["phase"], r["status"]) for r in result["results"]] == [("w1", "sleep", "ok")]
    assert agents["w1"].service.control.sleeping and await agents["w1"].engine.is_sleeping()

    # Out of the fence as the sleep answers: the gateway sends it nothing.
    assert in_fence(gateway_fleet) == {"w0", "w2"}
    assert await served_by(gateway_fleet) <= {"w0", "w2"}
    st = await ctl.state()
    w1 = ctl.worker(st, "w1")
    assert (w1["sleeping"], w1["cordoned"], w1["serving"], w1["ready"]) == (True, True, False, False)
    assert st["sleeping"] == 1 and st["phase"] == "serving" and st["applied"]["converged"] is True
    slept = st["desired"]["asleep"]["w1"]
    assert slept["level"] == 1 and slept["weight_version"] == "default" and slept["checksums_digest"]

    # The reconciler leaves it asleep (no resume, no convergence); another operation skips it.
    before = len(agents["w1"].traced)
    record = ctl.ctl.registry.get("w1")
    assert record is not None and ctl.ctl.reconciler.plan_for(record) == []
    await ctl.ctl.reconciler.reconcile_once()  # (the others may still be told the desired version)
    status, update = await ctl.call(
        "POST", "/v1/rl/update_weights", update_body("v1", write_checkpoint(tmp_path / "v1", 1))
    )
    assert status == 200, update
    skipped = next(r for r in update["results"] if r["worker_id"] == "w1")
    assert skipped["status"] == "skipped" and "asleep" in skipped["message"]
    assert calls(agents["w1"], before) == []
    assert agents["w1"].service.weight_version == "default"

    # Wake: behind the fleet's v1 now, so loaded, verified, then back in the fence.
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {"worker_ids": ["w1"]})
    assert status == 200, result
    assert [(r["worker_id"], r["status"]) for r in result["results"]] == [("w1", "ok")]
    assert calls(agents["w1"], before)[:2] == ["POST /wake_up", "POST /v1/agent/weights/disk"]
    st = await ctl.state()
    w1 = ctl.worker(st, "w1")
    assert (w1["sleeping"], w1["cordoned"], w1["serving"], w1["weight_version"]) == (False, False, True, "v1")
    assert st["desired"]["asleep"] == {} and st["sleeping"] == 0
    assert in_fence(gateway_fleet) == {"w0", "w1", "w2"}

    async def w1_serves() -> bool:
        return "w1" in await served_by(gateway_fleet, 24)

    await wait_for(w1_serves, what="w1 serving through the gateway again")


async def test_level_2_loses_the_weights_a_wake_reloads_the_fleet_checkpoint_or_fails_verification(
    sim_fleet: Any, tmp_path: Path
) -> None:
    ctl, agents = sim_fleet.ctl, {a.agent_id: a for a in sim_fleet.agents}
    # No checkpoint known to the fleet (never updated): nothing to reload the discarded weights from.
    status, _ = await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["w0"], "level": 2})
    assert status == 200
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {})
    assert status == 502, result  # the only member asleep failed: none ok
    (w0,) = [r for r in result["results"] if r["worker_id"] == "w0"]
    assert w0["status"] == "error" and w0["code"] == "verify_failed", w0
    assert "checksums differ from those it had when it went to sleep" in w0["message"]
    assert "kept asleep" in w0["message"]
    assert [r["worker_id"] for r in result["results"]] == ["w0"]  # a wake of all is about the sleepers
    st = await ctl.state()
    assert ctl.worker(st, "w0")["sleeping"] is True and "w0" in st["desired"]["asleep"]
    # Awake in its engine but kept asleep: the reconciler puts it back to sleep.
    await wait_for(lambda: agents["w0"].service.control.sleeping, what="w0 put back to sleep by the reconciler")

    # With the fleet's checkpoint, the wake reloads it and the checksums are those it slept with.
    ckpt = write_checkpoint(tmp_path / "v1", 1)
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", ckpt))
    assert status == 200, result
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {"worker_ids": ["w0"]})
    assert status == 200, result
    status, _ = await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["w0"], "level": 2})
    assert status == 200
    before = len(agents["w0"].traced)
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {"worker_ids": ["w0"]})
    assert status == 200, result
    assert "POST /v1/agent/weights/disk" in calls(agents["w0"], before)
    st = await ctl.state()
    assert ctl.worker(st, "w0")["serving"] is True and ctl.worker(st, "w0")["weight_version"] == "v1"


async def test_a_wake_the_engine_refuses_keeps_the_member_out(sim_fleet: Any) -> None:
    ctl, agents = sim_fleet.ctl, {a.agent_id: a for a in sim_fleet.agents}
    status, _ = await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["w2"]})
    assert status == 200
    agents["w2"].engine.fail_next("wake_up", "no memory to wake into")
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {"worker_ids": ["w2"]})
    assert status == 502, result
    (w2,) = result["results"]
    assert w2["phase"] == "wake_up" and "no memory to wake into" in w2["message"] and "kept asleep" in w2["message"]
    st = await ctl.state()
    assert ctl.worker(st, "w2")["sleeping"] is True and ctl.worker(st, "w2")["serving"] is False
    # A partial wake (weights only) leaves it asleep and unverified; the full one returns it.
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {"worker_ids": ["w2"], "tags": ["weights"]})
    assert status == 200 and result["detail"]["partial"] is True, result
    assert ctl.worker(await ctl.state(), "w2")["sleeping"] is True
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {"worker_ids": ["w2"]})
    assert status == 200, result
    assert ctl.worker(await ctl.state(), "w2")["serving"] is True


async def test_asleep_outlives_a_worker_restart_and_a_controller_restart(sim_fleet: Any, tmp_path: Path) -> None:
    ctl, agents = sim_fleet.ctl, {a.agent_id: a for a in sim_fleet.agents}
    status, _ = await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["w1"], "mode": "wait"})
    assert status == 200
    await agents["w1"].restart()  # a fresh process image: awake
    assert not agents["w1"].service.control.sleeping
    await wait_for(lambda: agents["w1"].service.control.sleeping, what="the restarted w1 put back to sleep")
    assert ctl.worker(await ctl.state(), "w1")["serving"] is False

    await ctl.client.close()  # the controller goes; the desired state stays on disk
    again = await start_controller(tmp_path, sim_fleet.agents)
    try:
        st = await again.state()
        assert "w1" in st["desired"]["asleep"] and again.worker(st, "w1")["sleeping"] is True
        assert again.worker(st, "w1")["serving"] is False and again.worker(st, "w0")["serving"] is True
        status, result = await again.call("POST", "/v1/rl/wake_up", {})
        assert status == 200, result
        assert again.worker(await again.state(), "w1")["serving"] is True
    finally:
        await again.client.close()


async def test_a_wake_of_a_paused_fleet_leaves_the_member_paused(sim_fleet: Any) -> None:
    ctl, agents = sim_fleet.ctl, {a.agent_id: a for a in sim_fleet.agents}
    assert (await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["w0"]}))[0] == 200
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    assert status == 200 and {r["worker_id"]: r["status"] for r in result["results"]}["w0"] == "skipped"
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {})
    assert status == 200, result
    assert [r["phase"] for r in result["results"] if r["worker_id"] == "w0"] == ["pause"]
    assert agents["w0"].service.paused and not agents["w0"].service.control.sleeping
    assert (await ctl.call("POST", "/v1/rl/resume", {}))[0] == 200
    assert ctl.worker(await ctl.state(), "w0")["serving"] is True


@pytest.mark.parametrize(
    "path,body,code,field",
    [
        ("sleep", {"level": 3}, 422, "level"),
        ("sleep", {"level": "1"}, 422, "level"),
        ("sleep", {"mode": "keep"}, 422, "mode"),
        ("sleep", {"timeout_s": 0}, 422, "timeout_s"),
        ("sleep", {"selector": "role in"}, 422, "selector"),
        ("sleep", {"selector": "role=teacher"}, 422, "selector"),
        ("sleep", {"worker_ids": ["w9"]}, 404, "worker_ids"),
        ("sleep", {"worker_ids": []}, 422, "worker_ids"),
        ("sleep", {"worker_ids": ["w0"], "selector": "a=b"}, 422, "worker_ids"),
        ("sleep", {"lvl": 1}, 422, "lvl"),
        ("wake_up", {"tags": ["gpu"]}, 422, "tags.0"),
        ("wake_up", {"tags": []}, 422, "tags"),
        ("wake_up", {"worker_ids": ["w9"]}, 404, "worker_ids"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_before_any_worker(
    sim_fleet: Any, path: str, body: dict, code: int, field: str
) -> None:
    ctl, agents = sim_fleet.ctl, sim_fleet.agents
    _, ops_before = await ctl.call("GET", "/v1/rl/operations", headers={})
    before = [len(a.traced) for a in agents]
    status, answer = await ctl.call("POST", f"/v1/rl/{path}", body)
    assert status == code, answer
    assert answer["error"]["field"] == field, answer
    assert [calls(a, n) for a, n in zip(agents, before, strict=True)] == [[], [], []]
    assert (await ctl.call("GET", "/v1/rl/operations", headers={}))[1] == ops_before


async def test_a_broadcast_init_is_refused_while_members_are_asleep(sim_fleet: Any) -> None:
    ctl = sim_fleet.ctl
    assert (await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["w0"]}))[0] == 200
    status, answer = await ctl.call(
        "POST", "/v1/rl/weight_transfer/init", {"init_info": {"world_size": 3, "master_address": "127.0.0.1"}}
    )
    assert status == 409 and "w0" in answer["error"]["message"], answer


async def test_rlctl_sleep_state_wake(sim_fleet: Any) -> None:
    ctl: Ctl = sim_fleet.ctl
    rc, out, err = await rlctl(ctl.url, "sleep", "--worker", "w1", "--level", "1")
    assert rc == 0, err
    rc, out, err = await rlctl(ctl.url, "state")
    assert rc == 0, err
    row = next(line for line in out.splitlines() if " w1 " in f" {line} ")
    assert "asleep" in row and "asleep" in out.split("workers")[0], out
    rc, out, err = await rlctl(ctl.url, "-o", "json", "state")
    assert rc == 0 and next(w for w in json.loads(out)["workers"] if w["id"] == "w1")["sleeping"] is True
    rc, out, err = await rlctl(ctl.url, "wake", "--worker", "w1")
    assert rc == 0, err
    assert ctl.worker(await ctl.state(), "w1")["serving"] is True


async def test_the_agent_refuses_what_needs_memory_while_asleep(sim_fleet: Any) -> None:
    agent = sim_fleet.agents[0]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with http.post(f"{agent.url}/sleep", params={"level": "1"}, headers=auth) as resp:
            assert resp.status == 200 and await resp.json() == {"status": "sleeping", "level": 1}
        async with http.get(f"{agent.url}/is_sleeping", headers=auth) as resp:
            assert await resp.json() == {"is_sleeping": True}
        async with http.get(f"{agent.url}/readyz") as resp:
            assert resp.status == 503 and "asleep" in (await resp.json())["reason"]
        for method, path in (("POST", "/resume"), ("POST", "/weight_checker")):
            async with http.request(
                method,
                f"{agent.url}{path}",
                headers=auth,
                json={"action": "checksum"} if path == "/weight_checker" else None,
            ) as resp:
                assert resp.status == 409 and "asleep" in (await resp.json())["error"]["message"], path
        async with http.post(f"{agent.url}/wake_up", params=[("tags", "weights")], headers=auth) as resp:
            assert await resp.json() == {"status": "sleeping", "tags": ["weights"]}
        async with http.post(f"{agent.url}/wake_up", params=[("tags", "cpu")], headers=auth) as resp:
            assert resp.status == 422 and (await resp.json())["error"]["field"] == "tags.0"
        async with http.post(f"{agent.url}/wake_up", headers=auth) as resp:
            assert await resp.json() == {"status": "awake", "tags": None}
        async with http.get(f"{agent.url}/v1/agent/state", headers=auth) as resp:
            state = await resp.json()
            assert state["sleeping"] is False and state["paused"] is False

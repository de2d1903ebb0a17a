"""The controller against real agents on SimEngine, on loopback.

Covers the update transaction and its partial failures (500, a hang past the deadline,
a reset connection), reconciliation of a restarted worker, recovery of desired state
after a controller restart, 409 on a concurrent operation, and the shape of
/v1/rl/state and /v1/rl/workers. The agents are the real agent code; only the engine
is simulated.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import assemble
from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.controller import AUTH, CTL_TOKEN, Ctl, controller_settings, start_controller, update_body
from rlcp.harness.faults import Fault
from rlcp.harness.simfleet import TOKEN, start_fleet
from rlcp.harness.waiting import LoopStalls, wait_for
from tests.support.fleets import FleetShape

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(agents=3)


async def test_update_transaction_converges_and_verifies(sim_fleet, checkpoints):
    ctl, agents = sim_fleet
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", checkpoints[1]))
    assert status == 200, result
    assert result["status"] == "ok" and result["kind"] == "update_weights"
    assert [(r["worker_id"], r["status"], r["phase"]) for r in result["results"]] == [
        (a.agent_id, "ok", "resume") for a in agents
    ]
    for a in agents:
        assert a.service.weight_version == "v1" and not a.service.paused
        assert a.service.desired_weight_version == "v1"
        # The reconciler's first pass may tell a worker the desired version before the update reaches it.
        calls = [c for c in a.touched if c != "PUT /v1/agent/desired"]
        assert calls[:1] == ["POST /v1/agent/weights/update"]  # the whole update in one call
    st = await ctl.state()
    assert st["phase"] == "serving" and st["pause_state"] == "running"
    assert st["applied"] == {"weight_version": "v1", "converged": True, "verified": True}
    assert st["desired"]["weight_version"] == "v1"
    assert st["desired"]["weight_source"]["path"] == str(checkpoints[1])
    assert all(w["ready"] and w["serving"] and w["weight_version"] == "v1" for w in st["workers"])
    assert st["last_operation"]["id"] == result["id"]
    status, ops = await ctl.call("GET", "/v1/rl/operations", headers={})
    assert status == 200 and [o["id"] for o in ops["operations"]] == [result["id"]]

    # Idempotent: the same version again touches no worker.
    touched = [len(a.touched) for a in agents]
    status, again = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", checkpoints[1]))
    assert status == 200 and again["detail"].get("noop") is True
    assert all(r["status"] == "skipped" for r in again["results"])
    status, ops = await ctl.call("GET", "/v1/rl/operations?limit=1", headers={})
    assert status == 200 and [o["id"] for o in ops["operations"]] == [again["id"]]  # newest first
    status, err = await ctl.call("GET", "/v1/rl/operations?limit=0", headers={})
    assert status == 422 and err["error"]["field"] == "limit"
    assert [len(a.touched) for a in agents] == touched


async def test_worker_answering_500_stays_out_of_service_then_is_reconciled(sim_fleet, checkpoints):
    ctl, agents = sim_fleet
    bad = agents[1]
    bad.engine.fail_next("load_weights_from_disk")  # the update's load: the agent answers 502
    bad.faults["/v1/agent/weights/disk"] = Fault("status", 500)  # and the reconciler's, until cleared
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v2", checkpoints[2]))
    assert status == 207 and result["status"] == "partial"
    by_id = {r["worker_id"]: r for r in result["results"]}
    assert by_id["w1"]["status"] == "error" and by_id["w1"]["phase"] == "update"
    assert "502" in by_id["w1"]["message"]
    assert by_id["w0"]["status"] == by_id["w2"]["status"] == "ok"
    # The failed worker stays paused and not ready; the rest serve the new version.
    assert bad.service.paused and bad.service.not_ready_reason() is not None
    st = await ctl.state()
    assert st["phase"] == "degraded" and st["applied"]["converged"] is False
    assert st["applied"]["weight_version"] is None  # the fleet disagrees
    w1 = ctl.worker(st, "w1")
    # Read once after its call failed (it answered): the agent's own reason.
    assert not w1["ready"] and not w1["serving"] and "weight change failed" in w1["not_ready_reason"]
    status, listing = await ctl.call("GET", "/v1/rl/workers", headers={})
    assert {w["instance_id"]: w["serving"] for w in listing["workers"]} == {"w0": True, "w1": False, "w2": True}

    bad.faults.clear()  # the worker recovers: the reconciler brings it to v2 and resumes it
    await wait_for(lambda: bad.service.weight_version == "v2" and not bad.service.paused, what="w1 reconciled")
    st = await wait_for(lambda: _converged(ctl), what="fleet converged")
    assert st["phase"] == "serving"


async def _converged(ctl: Ctl):
    st = await ctl.state()
    return st if st["applied"]["converged"] else None


async def test_hang_past_deadline_and_reset_connection_fail_only_that_worker(sim_fleet, checkpoints):
    ctl, agents = sim_fleet
    agents[0].faults["/v1/agent/weights/update"] = Fault("hang")  # an update's one call
    agents[2].faults["/v1/agent/weights/update"] = Fault("reset")
    async with LoopStalls() as stalls:  # the bound below leaves out the time the loop could not run
        t0 = time.monotonic()
        status, result = await ctl.call(
            "POST", "/v1/rl/update_weights", update_body("v3", checkpoints[3], timeout_s=0.5, pause_mode="abort")
        )
        elapsed = time.monotonic() - t0 - stalls.s
    assert status == 207
    by_id = {r["worker_id"]: r for r in result["results"]}
    assert (by_id["w0"]["status"], by_id["w0"]["phase"]) == ("timeout", "update")
    assert (by_id["w2"]["status"], by_id["w2"]["phase"]) == ("error", "update")
    assert (by_id["w1"]["status"], by_id["w1"]["phase"]) == ("ok", "resume")
    assert elapsed < 15, "a hung worker must cost its deadline, not forever"
    assert agents[1].service.weight_version == "v3"
    assert agents[0].service.weight_version != "v3"


async def test_restarted_worker_is_reconciled_before_it_is_ready(sim_fleet, checkpoints, tmp_path):
    ctl, agents = sim_fleet
    adapter = write_adapter(tmp_path / "adapter")
    assert (await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", checkpoints[1])))[0] == 200
    status, result = await ctl.call("POST", "/v1/rl/loras", {"name": "ad", "path": str(adapter), "version": "7"})
    assert status == 200, result
    target = agents[2]
    old_instance = target.service.instance_id
    await target.restart()  # back with base weights, no adapter, no desired version
    assert target.service.weight_version != "v1" and target.service.instance_id != old_instance
    seen_ready_while_stale = False

    async def check():
        nonlocal seen_ready_while_stale
        # The restart seen first, then the state read: a document read before the poll that
        # saw the restart still shows the old instance's v1.
        seen_restart = ctl.ctl.registry.get("w2").status.instance_id == target.service.instance_id
        st = await ctl.state()
        w = ctl.worker(st, "w2")
        if w["ready"] and w["weight_version"] != "v1":
            seen_ready_while_stale = True
        return seen_restart and w["ready"] and w["weight_version"] == "v1" and w["loras"] == {"ad": "7"}

    await wait_for(check, what="w2 converged")
    assert not seen_ready_while_stale
    assert target.service.weight_version == "v1" and target.service.desired_weight_version == "v1"
    assert [(lo.name, lo.version) for lo in target.service.state().loras] == [("ad", "7")]


async def test_controller_restart_recovers_desired_state(sim_fleet, checkpoints, tmp_path):
    ctl, agents = sim_fleet
    assert (await ctl.call("POST", "/v1/rl/update_weights", update_body("v2", checkpoints[2])))[0] == 200
    await ctl.client.close()
    # While no controller runs, one worker restarts on base weights.
    await agents[0].restart()
    ctl2 = await start_controller(tmp_path, agents)
    try:
        st = await ctl2.state()
        assert st["desired"]["weight_version"] == "v2"
        await wait_for(lambda: agents[0].service.weight_version == "v2", what="w0 reconciled by new controller")
        st = await wait_for(lambda: _converged(ctl2), what="converged")
        # No version applied twice: the workers that had v2 got no second load.
        for a in agents[1:]:
            assert (
                a.touched.count("POST /v1/agent/weights/update") + a.touched.count("POST /v1/agent/weights/disk") == 1
            )
    finally:
        await ctl2.client.close()
        ctl.client = ctl2.client  # the fixture closes it again harmlessly


async def test_concurrent_operation_gets_409(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", 5)
    agents = await start_fleet(2, [tmp_path], op_latency_s=0.5)
    ctl = await start_controller(tmp_path, agents)
    try:
        first = asyncio.create_task(ctl.call("POST", "/v1/rl/update_weights", update_body("v5", ckpt)))
        await wait_for(lambda: ctl.ctl.gate.holder == "update_weights", what="update running")

        async def in_a_step() -> dict | None:
            # The gate is held a moment before the first step (the record's write): wait for a step.
            st = await ctl.state()
            return st if st["phase"] in ("pausing", "updating", "verifying", "resuming") else None

        st = await wait_for(in_a_step, what="the update in one of its steps")
        assert st["last_operation"]["status"] == "running"
        status, body = await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
        assert status == 409 and body["error"]["code"] == "conflict"
        assert (await first)[0] == 200
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()


async def test_pause_and_resume_the_fleet(sim_fleet):
    ctl, agents = sim_fleet
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep", "timeout_s": 5})
    assert status == 200 and result["kind"] == "pause"
    st = await ctl.state()
    assert st["quiesced"] is True and st["pause_state"] == "paused" and st["desired"]["paused"] is True
    assert all(a.service.paused for a in agents)
    status, result = await ctl.call("POST", "/v1/rl/resume")
    assert status == 200
    st = await ctl.state()
    assert st["pause_state"] == "running" and not st["quiesced"]
    assert not any(a.service.paused for a in agents)


async def test_no_members_is_503(tmp_path):
    app = assemble(controller_settings(tmp_path, []), token=CTL_TOKEN)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/rl/pause", json={"mode": "abort"}, headers=AUTH)
        assert resp.status == 503 and (await resp.json())["error"]["code"] == "no_members"
        st = await (await client.get("/v1/rl/state")).json()
        assert st["phase"] == "failed" and st["workers"] == []


async def test_agent_killed_mid_update_is_named_then_reconciled_after_restart(tmp_path):
    """A real agent process (SimEngine, slow loads) SIGKILLed during the update phase."""
    from rlcp.harness.http import call, free_port
    from rlcp.harness.processes import AgentProcess

    ckpt = write_checkpoint(tmp_path / "ckpt", 4)
    port = free_port()
    config = {
        "agent_id": "proc",
        "allowed_roots": [str(tmp_path)],
        "log_format": "json",
        "engine": {"kind": "sim", "model": "sim", "sim_op_latency_s": 1.0},
        "admin": {"port": port, "token": TOKEN},
    }
    proc = await asyncio.to_thread(AgentProcess(config, tmp_path / "proc", token=TOKEN).start)
    agents = await start_fleet(2, [tmp_path])
    specs = [a.spec() for a in agents] + [{"id": "proc", "admin_url": f"http://127.0.0.1:{port}"}]
    app = assemble(controller_settings(tmp_path, specs), token=CTL_TOKEN)
    client = TestClient(TestServer(app))
    await client.start_server()
    ctl = Ctl(client)
    try:
        await wait_for(lambda: all(r.reachable for r in ctl.ctl.members()), what="reachable")
        update = asyncio.create_task(ctl.call("POST", "/v1/rl/update_weights", update_body("v4", ckpt)))
        await wait_for(lambda: ctl.ctl.log.phase == "updating", what="update phase")

        async def proc_loading() -> bool:  # the kill must land inside its disk load (1 s of engine latency)
            status, st = await call(client.session, "GET", proc.admin_url + "/v1/agent/state", timeout_s=5)
            return status == 200 and st["busy_with"] == "update_weights_from_disk"

        await wait_for(proc_loading, what="proc loading the new weights")
        proc.kill()
        status, result = await update
        assert status == 207
        by_id = {r["worker_id"]: r for r in result["results"]}
        assert by_id["proc"]["status"] in ("error", "timeout") and by_id["proc"]["phase"] == "update"
        assert all(by_id[a.agent_id]["status"] == "ok" for a in agents)
        assert all(a.service.weight_version == "v4" and not a.service.paused for a in agents)
        st = await ctl.state()
        dead = ctl.worker(st, "proc")
        assert not dead["reachable"] and not dead["ready"] and dead["last_error"]
        assert st["phase"] == "degraded"

        await asyncio.to_thread(proc.start)  # back on base weights
        st = await wait_for(lambda: _converged(ctl), timeout_s=30, what="restarted agent converged")
        dead = ctl.worker(st, "proc")
        assert dead["weight_version"] == "v4" and dead["ready"] and dead["paused"] is False
    finally:
        await client.close()
        proc.stop()
        for a in agents:
            await a.stop()


async def test_listing_discovery_adds_and_removes_workers(tmp_path):
    """Members come from a GET /v1/rl/workers listing served over HTTP; the fleet changes under it."""
    from aiohttp import web

    from rlcp.controlplane.discovery.http_listing import render_listing
    from rlcp.controlplane.workerspec import WorkerSpec

    ckpt = write_checkpoint(tmp_path / "ckpt", 6)
    agents = await start_fleet(3, [tmp_path])
    listed = agents[:2]

    async def listing(request: web.Request) -> web.Response:
        return web.json_response(render_listing([WorkerSpec(**a.spec()) for a in listed], namespace="test"))

    listing_app = web.Application()
    listing_app.router.add_get("/v1/rl/workers", listing)
    listing_server = TestServer(listing_app)
    await listing_server.start_server()
    settings = controller_settings(
        tmp_path,
        [],
        discovery={
            "kind": "http_listing",
            "http_listing": {
                "url": str(listing_server.make_url("/v1/rl/workers")),
                "interval_s": 0.05,
                "default_flavor": "agent",
            },
        },
    )
    client = TestClient(TestServer(assemble(settings, token=CTL_TOKEN)))
    await client.start_server()
    ctl = Ctl(client)
    try:
        await wait_for(lambda: len(ctl.ctl.members()) == 2 and all(r.reachable for r in ctl.ctl.members()))
        epoch = (await ctl.state())["membership_epoch"]
        assert (await ctl.call("POST", "/v1/rl/update_weights", update_body("v6", ckpt)))[0] == 200

        listed.append(agents[2])  # a late joiner, on base weights
        await wait_for(lambda: agents[2].service.weight_version == "v6", what="late joiner converged")
        st = await wait_for(lambda: _converged(ctl), what="converged with 3")
        assert st["membership_epoch"] == epoch + 1 and len(st["workers"]) == 3

        listed.remove(agents[0])
        await wait_for(lambda: "w0" not in ctl.ctl.registry, what="w0 removed")
        st = await ctl.state()
        assert [w["id"] for w in st["workers"]] == ["w1", "w2"] and st["membership_epoch"] == epoch + 2
        status, body = await ctl.call("GET", "/v1/rl/workers", headers={})
        assert [w["instance_id"] for w in body["workers"]] == ["w1", "w2"]
        assert all(w["serving"] and w["flavor"] == "agent" for w in body["workers"])
    finally:
        await client.close()
        await listing_server.close()
        for a in agents:
            await a.stop()


async def test_metrics_and_probes(sim_fleet, checkpoints):
    ctl, agents = sim_fleet
    await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", checkpoints[1]))
    resp = await ctl.client.get("/metrics")
    text = await resp.text()
    assert resp.status == 200
    assert 'rlcp_operation_duration_seconds_count{kind="update_weights",status="ok"} 1.0' in text
    assert "rlcp_members 3.0" in text and "rlcp_workers_ready 3.0" in text
    lag_probes = [line for line in text.splitlines() if line.startswith("rlcp_event_loop_lag_seconds_count ")]
    assert lag_probes and float(lag_probes[0].split()[1]) > 0, lag_probes  # the loop-lag probe runs
    assert (await ctl.client.get("/healthz")).status == 200
    assert (await ctl.client.get("/readyz")).status == 200


async def test_tokens_never_reach_the_controller_log(sim_fleet, checkpoints, capfd):
    ctl, agents = sim_fleet
    await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"}, headers={"Authorization": "Bearer wrong-guess"})
    agents[0].faults["/v1/agent/weights/update"] = Fault("status", 401)  # an update's call
    assert (await ctl.call("POST", "/v1/rl/update_weights", update_body("v7", checkpoints[1])))[0] == 207
    out, err = capfd.readouterr()
    assert "worker_call_failed" in out + err  # the failure was logged...
    for secret in (CTL_TOKEN, TOKEN, "wrong-guess"):
        assert secret not in out + err  # ...without any token

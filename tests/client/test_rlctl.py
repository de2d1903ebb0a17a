"""rlctl as a real subprocess against a running controller over SimEngine agents."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from rlcp.client.client import ControlPlaneClient, OperationFailed, RequestRejected
from rlcp.harness.checkpoints import write_adapter
from rlcp.harness.controller import AUTH, CTL_TOKEN, rlctl
from rlcp.harness.faults import Fault
from rlcp.harness.http import free_port

# A guard against a hang only: a test here runs rlctl as a process up to seven times, each importing
# the client; beside a full run at load ~20 one test took past 120 s (the fast lane beside CI28).
pytestmark = pytest.mark.timeout(900)


async def test_state_table_json_and_yaml(sim_fleet):
    ctl, agents = sim_fleet
    url = ctl.url
    rc, out, err = await rlctl(url, "state")
    assert rc == 0, err
    assert "phase" in out and "w0" in out and "w1" in out
    rc, out, _ = await rlctl(url, "-o", "json", "state")
    assert rc == 0
    from_cli = json.loads(out)
    direct = await ctl.state()
    volatile = ("last_seen", "requests")
    strip = lambda st: {**st, "workers": [{k: v for k, v in w.items() if k not in volatile} for w in st["workers"]]}
    assert strip(from_cli) == strip(direct)
    rc, out, _ = await rlctl(url, "-o", "yaml", "state")
    assert rc == 0 and yaml.safe_load(out)["membership_epoch"] == direct["membership_epoch"]
    rc, out, _ = await rlctl(url, "state", "--watch", "--interval", "0.05", "--count", "2")
    assert rc == 0 and "w0" in out
    rc, out, _ = await rlctl(url, "workers")
    assert rc == 0 and "w0" in out and "agent" in out


async def test_pause_resume_update_lora_and_ops(sim_fleet, checkpoints, tmp_path):
    ctl, agents = sim_fleet
    url, ckpt = ctl.url, checkpoints[1]
    rc, out, err = await rlctl(url, "pause", "--mode", "keep")
    assert rc == 0, err
    assert all(a.service.paused for a in agents) and "pause" in out
    rc, out, _ = await rlctl(url, "resume")
    assert rc == 0 and not any(a.service.paused for a in agents)

    rc, out, err = await rlctl(url, "update-weights", "--version", "v1", "--path", str(ckpt))
    assert rc == 0, err
    assert "w0" in out and "w1" in out and "ok" in out
    assert all(a.service.weight_version == "v1" for a in agents)

    adapter = write_adapter(tmp_path / "ad")
    rc, out, err = await rlctl(url, "lora", "load", "ad", str(adapter), "--version", "3")
    assert rc == 0, err
    assert all([lo.name for lo in a.service.state().loras] == ["ad"] for a in agents)
    rc, _, err = await rlctl(url, "lora", "unload", "ad")
    assert rc == 0, err
    assert all(a.service.state().loras == [] for a in agents)

    rc, out, _ = await rlctl(url, "-o", "json", "ops")
    kinds = [op["kind"] for op in json.loads(out)]
    assert kinds == ["unload_lora", "load_lora", "update_weights", "resume", "pause"]
    rc, out, _ = await rlctl(url, "ops")
    assert rc == 0 and "update_weights" in out


async def test_partial_failure_exits_1_and_names_the_worker(sim_fleet, checkpoints):
    ctl, agents = sim_fleet
    url, ckpt = ctl.url, checkpoints[1]
    agents[1].faults["/v1/agent/weights/update"] = Fault("status", 500)
    rc, out, err = await rlctl(url, "update-weights", "--version", "v2", "--path", str(ckpt))
    assert rc == 1, (out, err)
    assert "partial" in out and "w1" in out and "update" in out and "500" in out


async def test_errors_are_one_line_and_exit_2(sim_fleet):
    url = sim_fleet.ctl.url
    rc, out, err = await rlctl(f"http://127.0.0.1:{free_port()}", "state")
    assert rc == 2 and err.count("\n") == 1 and "cannot reach the controller" in err and "Traceback" not in err
    rc, out, err = await rlctl(url, "pause", token="wrong")
    assert rc == 2 and err.count("\n") == 1 and "unauthorized" in err
    rc, out, err = await rlctl(url, "update-weights", "--version", "v", "--path", "/etc")
    assert rc == 2 and err.count("\n") == 1 and "403" in err and "source.path" in err


async def test_client_error_taxonomy(sim_fleet, checkpoints):
    ctl, agents = sim_fleet
    url, ckpt = ctl.url, checkpoints[1]
    async with ControlPlaneClient(url, token=CTL_TOKEN) as client:
        with pytest.raises(RequestRejected) as rejected:
            await client.update_weights("v", "relative/path")
        assert rejected.value.status == 403 and rejected.value.field == "source.path"
        agents[0].faults["/v1/agent/weights/update"] = Fault("status", 500)  # an update's one call
        with pytest.raises(OperationFailed) as failed:
            await client.update_weights("v9", str(ckpt))
        assert {r.worker_id: r.status for r in failed.value.result.results} == {"w0": "error", "w1": "ok"}
        assert "w0 (update" in str(failed.value)
        agents[0].faults.clear()
        st = await client.wait_converged("v9", timeout_s=30)
        assert st.applied.weight_version == "v9"


async def test_sync_client_one_call_per_step(sim_fleet, checkpoints):
    from rlcp.client.client import SyncControlPlaneClient

    ctl, agents = sim_fleet
    url, ckpt = ctl.url, checkpoints[1]

    def trainer() -> list[str]:
        with SyncControlPlaneClient(url, token=CTL_TOKEN) as client:
            statuses = [client.update_weights(f"step-{i}", str(ckpt)).status for i in range(3)]
            assert client.state().applied.weight_version == "step-2"
            return statuses

    assert await asyncio.to_thread(trainer) == ["ok", "ok", "ok"]
    assert all(a.service.weight_version == "step-2" for a in agents)


async def test_a_rolling_update_is_followed_with_a_progress_bar_or_left_running(sim_fleet, checkpoints, tmp_path):
    ctl, agents = sim_fleet
    url, ckpt = ctl.url, checkpoints[1]
    rc, out, err = await rlctl(url, "update-weights", "--version", "r0", "--path", str(ckpt))
    assert rc == 0 and "bubble: 0/2 serving at least" in out, (out, err)
    status, _ = await ctl.call("POST", "/v1/rl/gateway/staleness", {"bound": 1})  # r0 may serve during the roll
    assert status == 200
    rc, out, err = await rlctl(url, "update-weights", "--version", "r1", "--path", str(ckpt), "--max-unavailable", "1")
    assert rc == 0, err
    # The bar's last frame (rlctl follows the operation), then the table with the bubble.
    assert "rolling wave 2/2" in out and "2/2" in out and "bubble: 1/2 serving at least" in out, out
    assert all(a.service.weight_version == "r1" for a in agents)
    # --no-wait prints the id at once; `ops show ID --follow` picks the update up.
    slow = Fault("delay", delay_s=1.0)
    agents[0].faults["/v1/agent/weights/disk"] = slow
    rc, out, err = await rlctl(
        url, "update-weights", "--version", "r2", "--path", str(ckpt), "--no-wait", "--max-unavailable", "50%"
    )
    assert rc == 0, err
    operation_id = out.strip()
    rc, out, err = await rlctl(url, "ops", "show", operation_id, "--follow")
    assert rc == 0 and "update_weights " + operation_id + ": ok" in out and "bubble:" in out, (out, err)
    rc, out, err = await rlctl(url, "-o", "json", "ops", "show", operation_id)
    shown = json.loads(out)
    assert shown["progress"]["waves"] == 2 and shown["bubble"]["min_serving"] == 1  # 50% of 2: one at a time
    rc, out, err = await rlctl(url, "ops", "show", "nope")
    assert rc == 2 and "404" in err and "no operation 'nope'" in err
    # A manifest file, as `POST /weight_checker` answers it: a wrong one fails every worker.
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"checksums": {"dp0:pp0:pcp0:tp0:layer.0.weight": "0" * 64}}))
    rc, out, err = await rlctl(
        url, "update-weights", "--version", "r3", "--path", str(ckpt), "--manifest", str(manifest)
    )
    assert rc == 1 and "failed" in out and "manifest" in out, (rc, out, err)


async def test_an_update_that_does_not_wait_answers_202_with_its_location(sim_fleet, checkpoints):
    ctl, agents = sim_fleet
    url, ckpt = ctl.url, checkpoints[1]
    body = {
        "version": "a1",
        "source": {"kind": "disk", "path": str(ckpt)},
        "wait": False,
        "strategy": {"type": "rolling", "max_unavailable": 1},
    }
    resp = await ctl.client.post("/v1/rl/update_weights", json=body, headers=AUTH)
    assert resp.status == 202, await resp.text()
    started = await resp.json()
    assert started["status"] == "running" and resp.headers["Location"] == f"/v1/rl/operations/{started['id']}"
    async with ControlPlaneClient(url, token=CTL_TOKEN) as client:
        done = await client.wait_operation(started["id"], poll_s=0.05, timeout_s=30)
    assert done.status == "ok" and done.progress.updated == 2 and done.bubble.members == 2
    state = await ctl.state()
    assert state["update"]["operation_id"] == started["id"] and state["update"]["status"] == "ok"
    status, answer = await ctl.call(
        "POST", "/v1/rl/update_weights", {**body, "strategy": {"type": "rolling", "max_unavailable": "0%"}}
    )
    assert status == 422 and "strategy.rolling.max_unavailable" in answer["error"]["field"], answer
    status, answer = await ctl.call(
        "POST", "/v1/rl/update_weights", {**body, "verify": False, "expected_checksums": {"a": "b"}}
    )
    assert status == 422 and answer["error"]["field"] == "expected_checksums", answer
    status, answer = await ctl.call("GET", "/v1/rl/operations/unknown")
    assert status == 404 and answer["error"]["field"] == "id", answer

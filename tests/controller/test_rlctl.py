"""rlctl as a real subprocess against a running controller over SimEngine agents."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import yaml

from harness.checkpoints import write_adapter, write_checkpoint
from harness.controller import CTL_TOKEN, start_controller
from harness.faults import Fault
from harness.http import free_port
from harness.simfleet import start_fleet
from rlclient.client import ControlPlaneClient, OperationFailed, RequestRejected

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def fleet(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", 1)
    agents = await start_fleet(2, [tmp_path])
    ctl = await start_controller(tmp_path, agents)
    url = str(ctl.client.make_url("")).rstrip("/")
    yield url, ctl, agents, ckpt, tmp_path
    await ctl.client.close()
    for a in agents:
        await a.stop()


async def rlctl(url: str, *args: str, token: str = CTL_TOKEN) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlclient.cli", "--url", url, "--token", token, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"COLUMNS": "200", "PATH": ""})
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode, out.decode(), err.decode()


async def test_state_table_json_and_yaml(fleet):
    url, ctl, agents, _, _ = fleet
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


async def test_pause_resume_update_lora_and_ops(fleet):
    url, ctl, agents, ckpt, tmp_path = fleet
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


async def test_partial_failure_exits_1_and_names_the_worker(fleet):
    url, ctl, agents, ckpt, _ = fleet
    agents[1].faults["/v1/agent/weights/disk"] = Fault("status", 500)
    rc, out, err = await rlctl(url, "update-weights", "--version", "v2", "--path", str(ckpt))
    assert rc == 1, (out, err)
    assert "partial" in out and "w1" in out and "update" in out and "500" in out


async def test_errors_are_one_line_and_exit_2(fleet):
    url, *_ = fleet
    rc, out, err = await rlctl(f"http://127.0.0.1:{free_port()}", "state")
    assert rc == 2 and err.count("\n") == 1 and "cannot reach the controller" in err and "Traceback" not in err
    rc, out, err = await rlctl(url, "pause", token="wrong")
    assert rc == 2 and err.count("\n") == 1 and "unauthorized" in err
    rc, out, err = await rlctl(url, "update-weights", "--version", "v", "--path", "/etc")
    assert rc == 2 and err.count("\n") == 1 and "403" in err and "source.path" in err


async def test_client_error_taxonomy(fleet):
    url, ctl, agents, ckpt, _ = fleet
    async with ControlPlaneClient(url, token=CTL_TOKEN) as client:
        with pytest.raises(RequestRejected) as rejected:
            await client.update_weights("v", "relative/path")
        assert rejected.value.status == 403 and rejected.value.field == "source.path"
        agents[0].faults["/v1/agent/prepare"] = Fault("status", 500)  # an update pauses with it
        with pytest.raises(OperationFailed) as failed:
            await client.update_weights("v9", str(ckpt))
        assert {r.worker_id: r.status for r in failed.value.result.results} == {"w0": "error", "w1": "ok"}
        assert "w0 (pause" in str(failed.value)
        agents[0].faults.clear()
        st = await client.wait_converged("v9", timeout_s=30)
        assert st.applied.weight_version == "v9"


async def test_sync_client_one_call_per_step(fleet):
    from rlclient.client import SyncControlPlaneClient

    url, ctl, agents, ckpt, _ = fleet

    def trainer() -> list[str]:
        with SyncControlPlaneClient(url, token=CTL_TOKEN) as client:
            statuses = [client.update_weights(f"step-{i}", str(ckpt)).status for i in range(3)]
            assert client.state().applied.weight_version == "step-2"
            return statuses

    assert await asyncio.to_thread(trainer) == ["ok", "ok", "ok"]
    assert all(a.service.weight_version == "step-2" for a in agents)

"""The compatibility facade: RL code written for one vLLM server drives the whole fleet."""

from __future__ import annotations

import pytest

from harness.checkpoints import write_adapter, write_checkpoint
from harness.controller import AUTH, start_controller
from harness.faults import Fault
from harness.simfleet import start_fleet

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def fleet(tmp_path):
    agents = await start_fleet(2, [tmp_path])
    ctl = await start_controller(tmp_path, agents)
    yield ctl, agents, tmp_path
    await ctl.client.close()
    for a in agents:
        await a.stop()


async def test_vllm_rl_route_shapes_drive_every_worker(fleet):
    ctl, agents, tmp_path = fleet
    assert await ctl.call("POST", "/pause?mode=keep") == (200, {"status": "paused"})
    assert all(a.service.paused for a in agents)
    assert await ctl.call("GET", "/is_paused", headers={}) == (200, {"is_paused": True})
    assert await ctl.call("POST", "/resume") == (200, {"status": "resumed"})
    assert await ctl.call("GET", "/is_paused", headers={}) == (200, {"is_paused": False})
    assert await ctl.call("GET", "/get_world_size", headers={}) == (200, {"world_size": 2})
    status, body = await ctl.call("POST", "/pause?mode=nap")
    assert status == 422 and body["error"]["field"] == "mode"


async def test_disk_and_lora_routes_frameworks_call(fleet):
    ctl, agents, tmp_path = fleet
    ckpt = write_checkpoint(tmp_path / "step-3", 3)
    status, body = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt)})
    assert (status, body["weight_version"]) == (200, "step-3")
    assert all(a.service.weight_version == "step-3" for a in agents)
    assert await ctl.call("GET", "/weight_info", headers={}) == (200, {"weight_version": "step-3"})
    status, _ = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt), "weight_version": "named"})
    assert status == 200 and all(a.service.weight_version == "named" for a in agents)

    adapter = write_adapter(tmp_path / "ad")
    status, body = await ctl.call("POST", "/load_lora_adapter", {"lora_name": "ad", "lora_path": str(adapter)})
    assert status == 200 and body["success"] is True
    assert all([lo.name for lo in a.service.state().loras] == ["ad"] for a in agents)
    # What the fleet serves, the base model included (prime-rl checks its model name here): these
    # members have no inference URL to ask, so they count with what they report of themselves.
    base = agents[0].service.state().model
    status, models = await ctl.call("GET", "/v1/models", headers={})
    assert status == 200 and {m["id"]: m["parent"] for m in models["data"]} == {base: None, "ad": base}
    assert (await ctl.client.get("/health")).status == 200


async def test_facade_errors_are_never_200(fleet):
    ctl, agents, tmp_path = fleet
    ckpt = write_checkpoint(tmp_path / "c", 4)
    agents[0].faults["/v1/agent/weights/disk"] = Fault("status", 500)
    status, body = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt)})
    assert status == 207 and {r["worker_id"]: r["status"] for r in body["results"]} == {"w0": "error", "w1": "ok"}
    before = [list(a.touched) for a in agents]
    for payload, want, field in (({}, 422, "weight_dir"), ({"weight_dir": "/etc"}, 403, "weight_dir"),
                                 ({"weight_dir": str(ckpt), "x": 1}, 422, "x")):
        status, body = await ctl.call("POST", "/update_weights", payload)
        assert (status, body["error"]["field"]) == (want, field)
    assert [a.touched for a in agents] == before
    status, body = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt)}, headers={})
    assert status == 401
    resp = await ctl.client.post("/init_weight_transfer_engine", json={}, headers=AUTH)
    assert resp.status == 422 and (await resp.json())["error"]["field"] == "init_info"

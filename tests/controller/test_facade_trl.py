"""TRL 1.16.0's server clients against the facade, call for call as they send them
(`trl/generation/vllm_client.py` for `GRPOTrainer`, `trl/experimental/async_grpo/vllm_client.py`
for `AsyncGRPOTrainer`; TESTING.md, "TRL"), over SimEngine agents: the weight-sync calls and
what the fleet is left with after them."""

from __future__ import annotations

import aiohttp
import pytest

from rlcp.harness.controller import AUTH
from rlcp.harness.waiting import wait_for
from tests.controller.fleets import FleetShape

pytestmark = pytest.mark.timeout(120)
CHUNK = {"names": ["model.embed_tokens.weight"], "dtype_names": ["float32"], "shapes": [[8, 4]]}


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(agents=2)


async def _init(ctl) -> None:
    await wait_for(lambda: all(r.status and r.status.world_size for r in ctl.ctl.members()), what="world sizes")
    status, body = await ctl.call("GET", "/get_world_size", headers={})
    assert status == 200
    # What TRL sends: world_size = get_world_size() + 1, rank_offset 1, and on vLLM >= 0.28 `packed: true`.
    init_info = {
        "master_address": "127.0.0.1",
        "master_port": 29999,
        "rank_offset": 1,
        "world_size": body["world_size"] + 1,
        "packed": True,
    }
    status, body = await ctl.call("POST", "/init_weight_transfer_engine", {"init_info": init_info})
    assert status == 200, body


async def _sync(ctl, start_body: dict | None) -> dict:
    """One weight sync as TRL sends it: start, one chunk, finish with no version, prefix cache reset."""
    status, body = await ctl.call("POST", "/start_weight_update", start_body)
    assert status == 200, body
    status, body = await ctl.call("POST", "/update_weights", {"update_info": CHUNK})
    assert status == 200, body
    status, finished = await ctl.call("POST", "/finish_weight_update", {})
    assert status == 200, finished
    status, body = await ctl.call("POST", "/reset_prefix_cache")
    assert status == 200, body
    return finished


async def _completion_version(http: aiohttp.ClientSession, gateway) -> str:
    body = {"model": "sim", "prompt": "hello", "max_tokens": 2}
    async with http.post(f"{gateway.url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["X-RL-Weight-Version"]


async def test_grpo_trainer_sync_without_resume_or_version_leaves_a_named_fleet_serving(gateway_fleet):
    """GRPOTrainer never pauses, never resumes, and names no version: start paused the fleet,
    finish resumed it, and the controller named the weights."""
    agents, ctl, gateway, http = gateway_fleet
    await _init(ctl)
    for step in (1, 2):
        finished = await _sync(ctl, {})
        assert finished == {"message": "Weight update finished", "weight_version": f"broadcast-{step}"}
        st = await ctl.state()
        assert st["applied"] == {"weight_version": f"broadcast-{step}", "converged": True, "verified": True}
        assert st["desired"]["weight_version"] == f"broadcast-{step}"
        assert st["phase"] == "serving" and st["pause_state"] == "running"
        assert all(a.service.weight_version == f"broadcast-{step}" and not a.service.paused for a in agents)
        assert await ctl.call("GET", "/weight_info", headers={}) == (200, {"weight_version": f"broadcast-{step}"})
        await wait_for(lambda: len(gateway.router.table().routes) == len(agents), what="every member back in the fence")
        assert await _completion_version(http, gateway) == f"broadcast-{step}"


async def test_async_grpo_trainer_sync_accepts_is_checkpoint_format(sim_fleet):
    """AsyncGRPOTrainer pauses (keep), starts with `is_checkpoint_format: true`, finishes with no
    body at all, and resumes."""
    ctl, agents = sim_fleet
    await _init(ctl)
    assert await ctl.call("POST", "/pause?mode=keep") == (200, {"status": "paused"})
    status, body = await ctl.call("POST", "/start_weight_update", {"is_checkpoint_format": True})
    assert status == 200, body
    assert (await ctl.call("POST", "/update_weights", {"update_info": CHUNK}))[0] == 200
    resp = await ctl.client.post("/finish_weight_update", headers=AUTH)  # TRL sends no body here
    assert resp.status == 200 and (await resp.json())["weight_version"] == "broadcast-1"
    assert all(a.service.paused for a in agents)  # the trainer paused: its resume, not the finish's
    assert await ctl.call("POST", "/resume") == (200, {"status": "resumed"})
    st = await ctl.state()
    assert st["applied"]["weight_version"] == "broadcast-1" and st["phase"] == "serving"


async def test_a_named_finish_keeps_its_name_and_minting_skips_names_taken(sim_fleet):
    ctl, agents = sim_fleet
    await _init(ctl)
    for name in ("broadcast-1", None):  # a trainer's own `broadcast-1`, then an unnamed finish
        assert (await ctl.call("POST", "/start_weight_update", {}))[0] == 200
        assert (await ctl.call("POST", "/update_weights", {"update_info": CHUNK}))[0] == 200
        status, body = await ctl.call("POST", "/finish_weight_update", {"weight_version": name} if name else {})
        assert status == 200, body
    assert body["weight_version"] == "broadcast-2"
    assert (await ctl.state())["applied"]["weight_version"] == "broadcast-2"


@pytest.mark.parametrize(
    ("start_body", "field"),
    [
        ({"is_checkpoint_format": False}, "is_checkpoint_format"),
        ({"is_checkpoint_format": "yes"}, "is_checkpoint_format"),
        ({"other": 1}, "other"),
    ],
)
async def test_a_start_body_the_fleet_cannot_honour_is_refused_before_any_worker(sim_fleet, start_body, field):
    ctl, agents = sim_fleet
    await _init(ctl)
    touched = [list(a.touched) for a in agents]
    status, body = await ctl.call("POST", "/start_weight_update", start_body)
    assert (status, body["error"]["field"]) == (422, field), body
    assert [a.touched for a in agents] == touched

"""TRL 1.16.0's server clients against the facade, call for call as they send them
(`trl/generation/vllm_client.py` for `GRPOTrainer`, `trl/experimental/async_grpo/vllm_client.py`
for `AsyncGRPOTrainer`; TESTING.md, "TRL"), over SimEngine agents: the weight-sync calls and
what the fleet is left with after them."""

from __future__ import annotations

import aiohttp
import pytest

from rlcp.harness.controller import AUTH, PATIENT_WORKER_CALLS, start_controller
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import FleetShape
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(120)
CHUNK = {"names": ["model.embed_tokens.weight"], "dtype_names": ["float32"], "shapes": [[8, 4]]}


@pytest.fixture
def fleet_shape() -> FleetShape:
    # The TRL calls here are refused when every member's last read failed (`PATIENT_WORKER_CALLS`).
    # The modules' tests of unread members start fleets of their own (`start_controller` below).
    return FleetShape(agents=2, settings={"workers": {"token": AGENT_TOKEN, **PATIENT_WORKER_CALLS}})


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
    rid = fresh_request_id("refused-start")
    status, body = await ctl.call("POST", "/start_weight_update", start_body, headers=with_request_id(rid))
    assert (status, body["error"]["field"]) == (422, field), body
    assert_no_worker_touched(agents, rid, start_body)


# -- GET /server_info -------------------------------------------------------------------------
async def _fleet(tmp_path, *overrides: dict):
    agents = [
        await SimAgent(f"w{i}", [tmp_path], engine_kwargs={"config_overrides": o}).start()
        for i, o in enumerate(overrides)
    ]
    ctl = await start_controller(tmp_path, agents)
    await wait_for(lambda: all(r.reachable for r in ctl.ctl.members()), what="every member reachable")
    return ctl, agents


async def _close(ctl, agents) -> None:
    await ctl.client.close()
    for a in agents:
        await a.stop()


async def test_server_info_is_the_common_config_with_the_keys_trl_reads(sim_fleet):
    ctl, agents = sim_fleet
    status, body = await ctl.call("GET", "/server_info?config_format=json", headers={})  # TRL sends no token
    assert status == 200, body
    config = body["vllm_config"]
    # What TRL reads, as each of its clients reads it.
    assert config["model_config"]["dtype"] == "torch.float32"
    assert config["model_config"]["logprobs_mode"] == "raw_logprobs"
    assert config["weight_transfer_config"] == {"backend": "gloo"}
    assert config["lora_config"]["max_loras"] == 4 and config["lora_config"]["max_lora_rank"] == 16
    assert config["parallel_config"]["data_parallel_size"] == 1
    assert (body["vllm_env"], body["system_env"]) == ({}, {})
    assert body["fleet"]["members"] == ["w0", "w1"] and body["fleet"]["unread"] == {} == body["fleet"]["differing"]
    assert "reaches every member" in body["fleet"]["data_parallel"]
    # vLLM's default is its text form.
    status, body = await ctl.call("GET", "/server_info", headers={})
    assert status == 200 and isinstance(body["vllm_config"], str)
    assert body["vllm_config"].startswith("model='sim', ") and "data_parallel_size=1," in body["vllm_config"]
    assert "dtype=torch.float32" in body["vllm_config"]
    status, body = await ctl.call("GET", "/server_info?config_format=yaml", headers={})
    assert status == 422 and body["error"]["field"] == "config_format"


async def test_agent_serves_its_own_server_info(sim_fleet):
    ctl, agents = sim_fleet
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{agents[0].url}/server_info", params={"config_format": "json"}) as resp:
            assert resp.status == 200
            body = await resp.json()
    assert body["vllm_config"]["model_config"]["model"] == "sim"
    assert set(body) == {"vllm_config", "vllm_env", "system_env"}


async def test_server_info_says_what_differs_between_members(tmp_path):
    ctl, agents = await _fleet(
        tmp_path,
        {},
        {"model_config": {"dtype": "torch.bfloat16"}, "lora_config": {"max_loras": 2}},
        {"lora_config": None, "parallel_config": {"data_parallel_size": 2}},
    )
    try:
        status, body = await ctl.call("GET", "/server_info?config_format=json", headers={})
        assert status == 200, body
        config, differing = body["vllm_config"], body["fleet"]["differing"]
        assert config["model_config"]["dtype"] is None
        assert differing["model_config.dtype"] == {"w0": "torch.float32", "w1": "torch.bfloat16", "w2": "torch.float32"}
        # One member without LoRA: the fleet cannot load an adapter on every member.
        assert config["lora_config"] is None and differing["lora_config"]["w2"] is None
        # A member that runs data parallel itself: a load through it reaches one of its replicas.
        assert config["parallel_config"]["data_parallel_size"] == 2
        assert differing["parallel_config.data_parallel_size"] == {"w0": 1, "w1": 1, "w2": 2}
        assert config["model_config"]["logprobs_mode"] == "raw_logprobs"  # alike: no entry
        assert "model_config.logprobs_mode" not in differing
    finally:
        await _close(ctl, agents)


async def test_server_info_takes_the_smallest_capacity_and_names_a_member_it_cannot_read(tmp_path):
    ctl, agents = await _fleet(tmp_path, {}, {"lora_config": {"max_loras": 6, "max_lora_rank": 8}})
    try:
        status, body = await ctl.call("GET", "/server_info?config_format=json", headers={})
        assert status == 200, body
        assert body["vllm_config"]["lora_config"]["max_loras"] == 4
        assert body["vllm_config"]["lora_config"]["max_lora_rank"] == 8
        assert body["fleet"]["differing"]["lora_config.max_loras"] == {"w0": 4, "w1": 6}
        await agents[1].stop()
        await wait_for(lambda: not ctl.ctl.registry.get("w1").reachable, 10, "w1 to be seen unreachable")
        status, body = await ctl.call("GET", "/server_info?config_format=json", headers={})
        assert status == 200 and body["fleet"]["members"] == ["w0"] and body["fleet"]["unread"] == {"w1": "unreachable"}
        await agents[0].stop()
        await wait_for(lambda: not ctl.ctl.registry.get("w0").reachable, 10, "w0 to be seen unreachable")
        status, body = await ctl.call("GET", "/server_info", headers={})
        assert status == 503 and "w0: unreachable" in body["error"]["message"], body
        await agents[0].start()
        await agents[1].start()
    finally:
        await _close(ctl, agents)


def test_merge_is_key_by_key_and_data_parallel_is_the_largest_members_own():
    from rlcp.controlplane.fleet.server_config import merge_configs

    merged = merge_configs(
        {
            "b": {"parallel_config": {"tensor_parallel_size": 2}, "x": [1, 2], "only_b": 1},
            "a": {"parallel_config": {"tensor_parallel_size": 1, "data_parallel_size": 1}, "x": [1, 2]},
        }
    )
    assert merged.common == {
        "parallel_config": {"tensor_parallel_size": None, "data_parallel_size": 1},
        "x": [1, 2],
        "only_b": None,
    }
    assert merged.differing == {
        "parallel_config.tensor_parallel_size": {"a": 1, "b": 2},
        "parallel_config.data_parallel_size": {"a": 1},
        "only_b": {"b": 1},
    }

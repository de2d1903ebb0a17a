"""Broadcast updates end to end: a trainer process, the controller, two real vLLM CPU engines.

The trainer runs in its own process (`rlcp/harness/trainer.py`): it loads a Llama with
transformers and broadcasts every parameter as rank 0 through vLLM's own trainer-side engine
(`WeightTransferTrainerFactory.trainer_init` + `send_weights`) on this project's gloo
backend. Its `VLLMWeightSyncClient` points at the controller, never at a worker: the
controller assigns ranks and drives both agents. Greedy completions are exact functions
of the weights, so "both engines hold the broadcast weights" is checked against the
same weights loaded from disk.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.http import call, free_port
from rlcp.harness.trainer import run_trainer
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
PROMPT = "Weights move from the trainer to every engine in the fleet."


# -- fixtures ------------------------------------------------------------------------------------
async def _output(http, agent) -> list[int]:
    status, body = await call(
        http,
        "POST",
        agent.inference_url + "/v1/completions",
        body={
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": 24,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, body
    return body["choices"][0]["token_ids"]


async def _load_direct(http, agent, path: Path, version: str) -> None:
    """Straight into one agent, controller aside: serving, no desired version, these weights."""
    for method, route, body in (
        ("POST", "/resume", None),
        ("PUT", "/v1/agent/desired", {"weight_version": None}),
        ("POST", "/v1/agent/weights/disk", {"path": str(path), "version": version}),
    ):
        status, resp = await call(http, method, agent.admin_url + route, body=body, headers=agent.auth)
        assert status == 200, resp


@pytest.fixture
async def fleet(http, vllm_agent, vllm_agent_b, tiny_models, references, tmp_path):
    """Both agents on weights-1 from disk, a controller over them, and the reference
    outputs of weights-1 and weights-2; the agents are left as other tests expect."""
    agents = [vllm_agent, vllm_agent_b]
    if not references:
        await _load_direct(http, vllm_agent, tiny_models["weights-2"], "ref-2")
        references[2] = await _output(http, vllm_agent)
    for agent in agents:
        await _load_direct(http, agent, tiny_models["weights-1"], "base")
    references[1] = await _output(http, vllm_agent)
    assert references[1] != references[2] and await _output(http, vllm_agent_b) == references[1]
    specs = [a.spec(f"vllm-{i}") for i, a in enumerate(agents)]
    settings = controller_settings(
        tmp_path,
        specs,
        allowed_roots=[str(tiny_models["base"].parent)],
        workers={"token": vllm_agent.token, "timeout_s": 30, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        weight_transfer={"init_timeout_s": 150, "chunk_timeout_s": 150},
    )
    async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
        ctl = client.server.app[CONTROLLER]
        await wait_for(
            lambda: all(r.status and r.status.world_size for r in ctl.members()),
            timeout_s=30,
            what="both agents polled",
        )
        yield client, agents, references
    for agent in agents:
        await _load_direct(http, agent, tiny_models["weights-1"], "base")


async def _state(client) -> dict:
    return await (await client.get("/v1/rl/state")).json()


# -- tests -------------------------------------------------------------------------------------------
async def test_a_trainer_broadcasts_once_through_the_controller_and_both_engines_match_disk(
    http, fleet, tiny_models, tmp_path
):
    client, agents, refs = fleet
    spec = {
        "client": "controller",
        "url": str(client.make_url("")).rstrip("/"),
        "token": CTL_TOKEN,
        "model_dir": str(tiny_models["weights-2"]),
        "port": free_port(),
        "version": "bcast-7",
    }
    await run_trainer(spec, tmp_path / "trainer.log")

    assert [await _output(http, a) for a in agents] == [refs[2], refs[2]]
    st = await _state(client)
    assert st["applied"] == {"weight_version": "bcast-7", "converged": True, "verified": True}
    assert [(w["id"], w["weight_version"], w["ready"], w["paused"]) for w in st["workers"]] == [
        ("vllm-0", "bcast-7", True, False),
        ("vllm-1", "bcast-7", True, False),
    ]
    assert st["weight_transfer"]["members"] == [
        {"worker_id": "vllm-0", "rank_offset": 1, "world_size": 1},
        {"worker_id": "vllm-1", "rank_offset": 2, "world_size": 1},
    ]
    last = st["last_operation"]
    assert (last["kind"], last["status"], last["detail"]["version"]) == ("weight_transfer_update", "ok", "bcast-7")
    assert last["detail"]["chunks"] == 1


async def test_vllms_own_http_sync_client_drives_the_fleet_through_the_facade(http, fleet, tiny_models, tmp_path):
    """vLLM's HTTPVLLMWeightSyncClient, unchanged, pointed at the controller's root. It
    cannot set a header, so the token travels as HTTP Basic from a netrc file."""
    client, agents, refs = fleet
    await _load_direct(http, agents[0], tiny_models["weights-2"], "base-2")  # start from different weights
    await _load_direct(http, agents[1], tiny_models["weights-2"], "base-2")
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login trainer password {CTL_TOKEN}\n")
    netrc.chmod(0o600)
    spec = {
        "client": "vllm-http",
        "url": str(client.make_url("")).rstrip("/"),
        "model_dir": str(tiny_models["weights-1"]),
        "port": free_port(),
        "version": "bcast-8",
    }
    await run_trainer(spec, tmp_path / "trainer.log", env={"NETRC": str(netrc)})

    assert [await _output(http, a) for a in agents] == [refs[1], refs[1]]
    st = await _state(client)
    assert st["applied"]["weight_version"] == "bcast-8" and st["phase"] == "serving"
    status, body = await call(http, "GET", str(client.make_url("/weight_info")))
    assert (status, body) == (200, {"weight_version": "bcast-8"})


async def test_a_trainer_that_never_joins_fails_init_cleanly_and_the_fleet_keeps_serving(http, fleet):
    client, agents, refs = fleet
    init_info = {
        "master_address": "127.0.0.1",
        "master_port": free_port(),
        "rank_offset": 1,
        "world_size": 3,
        "timeout_s": 3.0,
    }
    t0 = time.monotonic()
    resp = await client.post("/v1/rl/weight_transfer/init", json={"init_info": init_info}, headers=AUTH)
    result = await resp.json()
    assert resp.status == 502, result
    assert time.monotonic() - t0 < 90
    for r in result["results"]:
        assert (r["status"], r["phase"]) == ("error", "init_weight_transfer") and "could not join" in r["message"]
    st = await _state(client)
    assert st["weight_transfer"] is None and st["pause_state"] == "running"
    assert [await _output(http, a) for a in agents] == [refs[1], refs[1]]

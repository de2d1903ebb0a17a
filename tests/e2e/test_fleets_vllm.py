"""Two fleets, two models, one controller, on real vLLM CPU engines: the session's agent serves
the tiny model `tiny` (the default fleet, at the root), a second agent serves another tiny
model, `tiny-teacher` (other weights, the same tokenizer), labelled `role=teacher` (the
teacher fleet, under /fleets/teacher/). The gateway routes each request by its `model` to the
fleet serving it; each fleet is updated on its own, and the greedy tokens say which weights
answered: an update of one fleet changes its answers and leaves the other's as they were."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.http import call
from rlcp.harness.processes import AgentProcess
from rlcp.harness.tiny_model import agent_engine
from rlcp.harness.waiting import wait_for
from tests.conftest import one_core

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = "Weights move from the trainer to every engine in the fleet."
TEACHER = "/fleets/teacher"


@pytest.fixture(scope="module")
def teacher_agent(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """An agent serving a second tiny model: the base model's tokenizer and config, seed 2's weights."""
    model = tmp_path_factory.mktemp("teacher-model") / "teacher"
    shutil.copytree(tiny_models["base"], model)
    for weights in tiny_models["weights-2"].iterdir():
        shutil.copy(weights, model / weights.name)
    config = {
        "agent_id": "vllm-teacher",
        "allowed_roots": [str(tiny_models["base"].parent)],
        "log_format": "json",
        "engine": agent_engine(model, served_model_name="tiny-teacher"),
    }
    # Core 1, beside the session's first agent (core 0) it serves with, as every other engine of the
    # suite is bound: with vLLM's default binding both engines' threads share the cores.
    agent = AgentProcess(
        config, tmp_path_factory.mktemp("teacher-agent"), name="teacher-agent", env=one_core(1)
    ).start()
    yield agent
    agent.stop()


async def test_two_fleets_serve_two_models_through_one_gateway_and_update_apart(
    vllm_agent, teacher_agent, tiny_models, tmp_path
):
    async with aiohttp.ClientSession() as http:

        async def tokens(url: str, model: str) -> tuple[list[int], dict[str, str]]:
            async with http.post(
                url + "/v1/completions",
                json={
                    "model": model,
                    "prompt": PROMPT,
                    "max_tokens": 16,
                    "temperature": 0,
                    "ignore_eos": True,
                    "return_token_ids": True,
                },
                timeout=aiohttp.ClientTimeout(total=60),
            ) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                return body["choices"][0]["token_ids"], dict(resp.headers)

        async def restore_policy() -> None:  # the session's agent, as other tests expect it
            for path, body in (
                ("/resume", None),
                ("/v1/agent/desired", {"weight_version": None}),
                ("/v1/agent/weights/disk", {"path": str(tiny_models["weights-1"]), "version": "base"}),
            ):
                status, resp = await call(
                    http,
                    "PUT" if "desired" in path else "POST",
                    vllm_agent.admin_url + path,
                    body=body,
                    headers=vllm_agent.auth,
                )
                assert status == 200, resp

        await restore_policy()
        seed1, _ = await tokens(vllm_agent.inference_url, "tiny")
        seed2, _ = await tokens(teacher_agent.inference_url, "tiny-teacher")
        assert seed1 != seed2  # two models: the same prompt, other tokens

        specs = [
            vllm_agent.spec("vllm-0") | {"labels": {"role": "policy"}},
            teacher_agent.spec("vllm-teacher") | {"labels": {"role": "teacher"}},
        ]
        settings = controller_settings(
            tmp_path,
            specs,
            allowed_roots=[str(tiny_models["base"].parent)],
            workers={"token": vllm_agent.token, "timeout_s": 10, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
            fleets={"teacher": {"selector": "role=teacher"}},
        )
        try:
            async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
                gateway = client.server.app[GATEWAY].url
                assert gateway is not None

                async def get(path: str) -> dict:
                    resp = await client.get(path)
                    assert resp.status == 200
                    return await resp.json()

                async def both_serving() -> bool:
                    listing = await get("/v1/rl/fleets")
                    return [(f["name"], f["serving"], f["models"]) for f in listing["fleets"]] == [
                        ("default", 1, ["tiny"]),
                        ("teacher", 1, ["tiny-teacher"]),
                    ]

                await wait_for(both_serving, 60, "both fleets serving their model")

                # By model, each to its fleet's member, answered by that member's weights.
                policy, headers = await tokens(gateway, "tiny")
                assert (policy, headers["X-RL-Worker"]) == (seed1, "vllm-0")
                teacher, headers = await tokens(gateway, "tiny-teacher")
                assert (teacher, headers["X-RL-Worker"]) == (seed2, "vllm-teacher")

                # The teacher fleet to seed 1's weights: its answers change, the policy's do not.
                resp = await client.post(
                    f"{TEACHER}/v1/rl/update_weights",
                    headers=AUTH,
                    json={
                        "version": "t-1",
                        "source": {"kind": "disk", "path": str(tiny_models["weights-1"])},
                        "pause_mode": "keep",
                        "verify": True,
                    },
                )
                result = await resp.json()
                assert resp.status == 200 and [r["worker_id"] for r in result["results"]] == ["vllm-teacher"], result
                teacher, headers = await tokens(gateway, "tiny-teacher")
                assert (teacher, headers["X-RL-Weight-Version"]) == (seed1, "t-1")
                policy, headers = await tokens(gateway, "tiny")
                assert policy == seed1 and headers["X-RL-Weight-Version"] != "t-1"
                assert (await get("/v1/rl/state"))["desired"]["weight_version"] is None

                # The policy (the root) to seed 2's: the teacher's answers stay seed 1's.
                resp = await client.post(
                    "/v1/rl/update_weights",
                    headers=AUTH,
                    json={
                        "version": "p-2",
                        "source": {"kind": "disk", "path": str(tiny_models["weights-2"])},
                        "pause_mode": "keep",
                        "verify": True,
                    },
                )
                result = await resp.json()
                assert resp.status == 200 and [r["worker_id"] for r in result["results"]] == ["vllm-0"], result
                policy, headers = await tokens(gateway, "tiny")
                assert (policy, headers["X-RL-Weight-Version"]) == (seed2, "p-2")
                teacher, headers = await tokens(gateway, "tiny-teacher")
                assert (teacher, headers["X-RL-Weight-Version"]) == (seed1, "t-1")
                root, named = await get("/v1/rl/state"), await get(f"{TEACHER}/v1/rl/state")
                assert (root["applied"]["weight_version"], named["applied"]["weight_version"]) == ("p-2", "t-1")
                assert root["applied"]["verified"] and named["applied"]["verified"]
        finally:
            await restore_policy()

"""End to end: the controller drives two agents on real vLLM CPU engines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.http import call
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
PROMPT = "Weights move from the trainer to every engine in the fleet."


async def greedy_ids(http: aiohttp.ClientSession, max_tokens: int, agent) -> list[int]:
    """The agent's greedy completion of PROMPT, as token ids."""
    status, body = await call(
        http,
        "POST",
        agent.inference_url + "/v1/completions",
        body={
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, body
    return body["choices"][0]["token_ids"]


async def test_disk_update_through_the_controller_reaches_both_engines(vllm_agent, vllm_agent_b, tiny_models, tmp_path):
    agents = [vllm_agent, vllm_agent_b]
    async with aiohttp.ClientSession() as http:

        async def load_direct(agent, seed: int, version: str) -> None:
            for path, body in (
                ("/resume", None),
                ("/v1/agent/desired", {"weight_version": None}),
                ("/v1/agent/weights/disk", {"path": str(tiny_models[f"weights-{seed}"]), "version": version}),
            ):
                status, resp = await call(
                    http, "PUT" if "desired" in path else "POST", agent.admin_url + path, body=body, headers=agent.auth
                )
                assert status == 200, resp

        # Reference outputs of each weight set, loaded straight into one engine.
        await load_direct(vllm_agent, 2, "ref-2")
        want = await greedy_ids(http, 24, vllm_agent)
        for agent in agents:
            await load_direct(agent, 1, "base")
        before = [await greedy_ids(http, 24, a) for a in agents]
        assert before[0] == before[1] != want

        specs = [a.spec(f"vllm-{i}") for i, a in enumerate(agents)]
        settings = controller_settings(
            tmp_path,
            specs,
            allowed_roots=[str(tiny_models["base"].parent)],
            workers={"token": vllm_agent.token, "timeout_s": 10, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        )
        async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
            await wait_for(lambda: client.server.app[CONTROLLER].registry.membership.synced)
            resp = await client.post(
                "/v1/rl/update_weights",
                headers=AUTH,
                json={
                    "version": "step-7",
                    "source": {"kind": "disk", "path": str(tiny_models["weights-2"])},
                    "pause_mode": "keep",
                    "verify": True,
                },
            )
            result = await resp.json()
            assert resp.status == 200, result
            assert {r["worker_id"]: (r["status"], r["phase"]) for r in result["results"]} == {
                "vllm-0": ("ok", "resume"),
                "vllm-1": ("ok", "resume"),
            }
            assert [await greedy_ids(http, 24, a) for a in agents] == [want, want]
            st = await (await client.get("/v1/rl/state")).json()
            assert st["applied"] == {"weight_version": "step-7", "converged": True, "verified": True}
            assert st["phase"] == "serving"
            assert [(w["weight_version"], w["ready"], w["paused"]) for w in st["workers"]] == [
                ("step-7", True, False)
            ] * 2
        for agent in agents:  # leave the shared agents as other tests expect them
            await load_direct(agent, 1, "base")


def rewriting_proxy(upstream: str, rewrites: dict[str, str]) -> web.Application:
    """An agent's admin API as seen through a proxy that swaps checkpoint paths in the weight
    routes' bodies: the node-local copy of a checkpoint at the same path holding other bytes."""

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        if request.path.startswith("/v1/agent/weights/") and body:
            doc = json.loads(body)
            doc["path"] = rewrites.get(doc.get("path"), doc.get("path"))
            body = json.dumps(doc).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with (
            aiohttp.ClientSession() as http,
            http.request(request.method, upstream + request.path_qs, data=body, headers=headers) as resp,
        ):
            return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


async def test_one_corrupted_mlp_weight_on_one_worker_fails_verification(
    vllm_agent, vllm_agent_b, tiny_models, tmp_path
):
    """vLLM's CPU engine keeps its linear layers' weights inside its kernels, where its own
    checksums do not reach; the agent reads them back, so one MLP weight off by one element on one
    worker fails that worker's verification, naming the tensor."""
    good = tiny_models["weights-2"]
    corrupt = Path(good.parent / f"weights-2-corrupt-{tmp_path.name}")
    shutil.copytree(good, corrupt)
    from safetensors.torch import load_file, save_file  # torch: here, not in every collecting process

    tensors = load_file(str(corrupt / "model.safetensors"))
    tensors["model.layers.1.mlp.down_proj.weight"][0, 0] += 1.0
    save_file(tensors, str(corrupt / "model.safetensors"), metadata={"format": "pt"})
    proxy = TestServer(rewriting_proxy(vllm_agent_b.admin_url, {str(good): str(corrupt)}))
    await proxy.start_server()
    try:
        proxied = {"admin_url": f"http://{proxy.host}:{proxy.port}"}
        specs = [vllm_agent.spec("vllm-0"), vllm_agent_b.spec("vllm-1") | proxied]
        settings = controller_settings(
            tmp_path,
            specs,
            allowed_roots=[str(good.parent)],
            workers={"token": vllm_agent.token, "timeout_s": 10, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        )
        async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
            await wait_for(lambda: client.server.app[CONTROLLER].registry.membership.synced)
            resp = await client.post(
                "/v1/rl/update_weights",
                headers=AUTH,
                json={
                    "version": "step-corrupt",
                    "source": {"kind": "disk", "path": str(good)},
                    "pause_mode": "keep",
                    "verify": True,
                },
            )
            result = await resp.json()
        outcome = {r["worker_id"]: r for r in result["results"]}
        assert outcome["vllm-0"]["status"] == "ok", result
        failed = outcome["vllm-1"]
        assert (failed["status"], failed["phase"], failed["code"]) == ("error", "verify", "verify_failed"), result
        assert "1 tensor(s) differ" in failed["message"] and "model.layers.1.mlp.down_proj." in failed["message"]
        assert "checksums_not_compared" not in result["detail"]  # every tensor was compared
    finally:
        await proxy.close()
        shutil.rmtree(corrupt)
        async with aiohttp.ClientSession() as http:  # leave the shared agents as other tests expect them
            for agent in (vllm_agent, vllm_agent_b):
                for path, body in (
                    ("/resume", None),
                    ("/v1/agent/desired", {"weight_version": None}),
                    ("/v1/agent/weights/disk", {"path": str(tiny_models["weights-1"]), "version": "base"}),
                ):
                    await call(
                        http,
                        "PUT" if "desired" in path else "POST",
                        agent.admin_url + path,
                        body=body,
                        headers=agent.auth,
                    )


async def test_sleep_leaves_the_fence_and_a_verified_wake_serves_the_same_tokens(
    vllm_agent, vllm_agent_b, tiny_models, tmp_path
):
    """Sleep and wake_up through the controller on real vLLM CPU engines. vLLM's CPU build
    accepts sleep and ignores its memory part ("sleep mode is not supported on CPU, ignore
    it"): the engine pauses its scheduler and resumes it on wake, the weights never leave
    memory. So this proves the sequencing and the fence -- out of the gateway's fence while
    asleep, verified (version and checksums) before serving again, the same greedy tokens
    after -- not a memory release."""
    agents = {"vllm-0": vllm_agent, "vllm-1": vllm_agent_b}
    async with aiohttp.ClientSession() as http:
        for agent in agents.values():  # as the shared agents may have been left by another test
            status, resp = await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
            assert status == 200, resp
        before = await greedy_ids(http, 16, vllm_agent_b)
        specs = [a.spec(worker_id) for worker_id, a in agents.items()]
        settings = controller_settings(
            tmp_path,
            specs,
            allowed_roots=[str(tiny_models["base"].parent)],
            workers={"token": vllm_agent.token, "timeout_s": 10, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        )
        async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
            gateway = client.server.app[GATEWAY]

            def fence() -> set[str]:
                table = gateway.router.table()
                return set() if table is None else set(table.routes)

            await wait_for(lambda: fence() == set(agents), timeout_s=30, what="both engines inside the fence")
            resp = await client.post("/v1/rl/sleep", headers=AUTH, json={"worker_ids": ["vllm-1"]})
            result = await resp.json()
            assert resp.status == 200, result
            assert [(r["worker_id"], r["phase"], r["status"]) for r in result["results"]] == [("vllm-1", "sleep", "ok")]
            assert fence() == {"vllm-0"}
            status, asleep = await call(http, "GET", vllm_agent_b.admin_url + "/is_sleeping", headers=vllm_agent_b.auth)
            assert status == 200 and asleep == {"is_sleeping": True}
            for _ in range(4):
                status, body = await call(
                    http,
                    "POST",
                    gateway.url + "/v1/completions",
                    body={"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
                )
                assert status == 200, body
            st = await (await client.get("/v1/rl/state")).json()
            w1 = next(w for w in st["workers"] if w["id"] == "vllm-1")
            assert (w1["sleeping"], w1["serving"], w1["paused"]) == (True, False, True)
            routed = {w["worker_id"]: w["routed"] for w in st["gateway"]["workers"]}
            assert routed.get("vllm-1", 0) == 0 and routed["vllm-0"] >= 4, routed

            resp = await client.post("/v1/rl/wake_up", headers=AUTH, json={})
            result = await resp.json()
            assert resp.status == 200, result
            assert [(r["worker_id"], r["status"]) for r in result["results"]] == [("vllm-1", "ok")]
            st = await (await client.get("/v1/rl/state")).json()
            w1 = next(w for w in st["workers"] if w["id"] == "vllm-1")
            assert (w1["sleeping"], w1["serving"], w1["paused"]) == (False, True, False)
            assert fence() == set(agents)
        assert await greedy_ids(http, 16, vllm_agent_b) == before

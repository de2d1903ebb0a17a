"""A trainer-shaped step through the vLLM-shaped facade, over two agents on real vLLM CPU
engines: sleep the fleet, wake the weights then the KV cache, sync weights through
`collective_rpc` (vLLM's `reload_weights`), reset the prefix caches, and sample through the
gateway -- the calls a colocated trainer written for one vLLM server makes, each on the
whole fleet.

vLLM's CPU build accepts sleep and ignores its memory part (TESTING.md): the engine pauses
and resumes, the weights stay. So this proves the sequencing, the fence and the answers on
real engines, not a memory release; the first partial wake may already leave a CPU engine
fully awake (it never released anything)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.http import call
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
PROMPT = "Weights move from the trainer to every engine in the fleet."


async def test_a_colocated_trainer_step_through_the_facade(vllm_agent, vllm_agent_b, tiny_models, tmp_path):
    agents = {"vllm-0": vllm_agent, "vllm-1": vllm_agent_b}
    async with aiohttp.ClientSession() as http:
        for agent in agents.values():  # as the shared agents may have been left by another test
            status, resp = await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
            assert status == 200, resp
        specs = [a.spec(worker_id) for worker_id, a in agents.items()]
        settings = controller_settings(
            tmp_path,
            specs,
            allowed_roots=[str(tiny_models["base"].parent)],
            workers={"token": vllm_agent.token, "timeout_s": 10, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        )
        async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
            ctl = client.server.app[CONTROLLER]
            gateway = client.server.app[GATEWAY]

            def fence() -> set[str]:
                table = gateway.router.table()
                return set() if table is None else set(table.routes)

            async def facade(method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
                resp = await client.request(method, path, headers=AUTH, json=body)
                return resp.status, await resp.json()

            await wait_for(lambda: fence() == set(agents), timeout_s=60, what="both engines inside the fence")
            # 1. sleep: every member leaves the fence at once, and is kept asleep.
            assert await facade("POST", "/sleep?level=1&mode=wait") == (200, {"status": "sleeping", "level": 1})
            assert fence() == set() and await facade("GET", "/is_sleeping") == (200, {"is_sleeping": True})
            # 2. wake the weights, then the KV cache: once fully awake, verified, back in the fence.
            status, body = await facade("POST", "/wake_up?tags=weights")
            assert status == 200 and body["tags"] == ["weights"], body
            assert await facade("POST", "/wake_up?tags=kv_cache") == (200, {"status": "awake", "tags": ["kv_cache"]})
            assert await facade("GET", "/is_sleeping") == (200, {"is_sleeping": False})
            await wait_for(lambda: fence() == set(agents), timeout_s=30, what="both engines back inside the fence")
            # 3. sync weights through collective_rpc: vLLM's reload_weights, the verified fleet update.
            weights = tiny_models["weights-2"]
            status, body = await facade(
                "POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}}
            )
            assert (status, body) == (200, {"results": [None, None]}), body.get("error", {}).get("workers", body)
            assert ctl.state().applied.weight_version == weights.name and ctl.state().applied.verified
            status, body = await facade("POST", "/collective_rpc", {"method": "execute_model"})
            assert status == 501 and "'execute_model'" in body["error"]["message"], body
            # 4. reset every member's prefix cache.
            assert await facade("POST", "/reset_prefix_cache") == (200, {"success": True})
            # 5. sample through the gateway, from both engines, at the new version; the render route too.
            await wait_for(lambda: fence() == set(agents), timeout_s=30, what="both engines serving the update")
            seen = set()
            for _ in range(8):
                async with http.post(
                    gateway.url + "/v1/completions",
                    json={"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    assert resp.headers["X-RL-Weight-Version"] == weights.name
                    seen.add(resp.headers["X-RL-Worker"])
            assert seen <= set(agents) and seen
            async with http.post(
                gateway.url + "/v1/chat/completions/render",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            ) as resp:
                assert resp.headers.get("X-RL-Worker") in agents, await resp.text()
                assert resp.status in (200, 403), await resp.text()  # 403: scale-out routes disabled
        for agent in agents.values():  # leave the shared agents as other tests expect them
            for path, body in (
                ("/resume", None),
                ("/v1/agent/desired", {"weight_version": None}),
                ("/v1/agent/weights/disk", {"path": str(tiny_models["weights-1"]), "version": "base"}),
            ):
                await call(
                    http, "PUT" if "desired" in path else "POST", agent.admin_url + path, body=body, headers=agent.auth
                )

"""The `sglang` flavor against SGLang's own server, with others: a trainer's broadcast on SGLang's
wire, a mixed fleet (agent, stock vLLM, SGLang) updated in one call, rollouts through the gateway
and a restart on old weights. The server is the folder's (conftest.py), shared with
test_sglang.py; each test leaves it resumed on the base weights. The restart test kills the server
and runs last (this module runs after test_sglang.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest

from rlcp.controlplane.assembly import GATEWAY
from rlcp.controlplane.workers.flavors.sglang import UNNAMED_WEIGHTS
from rlcp.controlplane.workers.transport import WorkerRejected
from rlcp.harness.controller import CTL_TOKEN, serving_controller, update_body
from rlcp.harness.http import call, free_port
from rlcp.harness.sglang import run_sglang_trainer, sglang_venv
from rlcp.harness.waiting import wait_for
from tests.controlplane.workers.flavors.sglang.support import (
    LONG_PROMPT,
    PROMPT,
    by_worker,
    engine_controller_settings,
    generate,
    load_direct,
)
from tests.support.engines import put_back

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]


# -- broadcast from a trainer on SGLang's wire --------------------------------------------------
async def broadcast(ctl, tiny_models, tmp_path, version: str, *, corrupt: bool = False) -> tuple[int, str]:
    """A trainer process (SGLang's venv, rank 0 of SGLang's kind of group) broadcasts weights-2
    through the controller: its exit code and log."""
    log = tmp_path / f"trainer-{version}.log"
    spec = {
        "url": str(ctl.client.make_url("")).rstrip("/"),
        "token": CTL_TOKEN,
        "model_dir": str(tiny_models["weights-2"]),
        "port": free_port(),
        "version": version,
        "corrupt": corrupt,
    }
    code = await run_sglang_trainer(spec, log, venv=sglang_venv())
    return code, log.read_text()[-4000:]


async def test_a_broadcast_from_a_trainer_changes_greedy_output_and_the_state_shows_the_version(
    http, server, ctl, refs, tiny_models, tmp_path
):
    assert (await generate(http, server))[0] == refs[1]
    # Fills SGLang's radix cache with the old weights' KV: unflushed, the output below would mix.
    assert (await generate(http, server, LONG_PROMPT))[0] == refs["long", 1]
    code, log = await broadcast(ctl, tiny_models, tmp_path, "bcast-2")
    assert code == 0, log

    ids, meta = await generate(http, server)
    assert ids == refs[2] and meta["weight_version"] == "bcast-2"
    assert (await generate(http, server, LONG_PROMPT))[0] == refs["long", 2]
    state = await ctl.state()
    assert state["applied"] == {"weight_version": "bcast-2", "converged": True, "verified": True}
    worker = ctl.worker(state, "sglang-0")
    assert (worker["weight_version"], worker["serving"], worker["paused"]) == ("bcast-2", True, False)
    assert state["weight_transfer"]["members"] == [{"worker_id": "sglang-0", "rank_offset": 1, "world_size": 1}]
    last = state["last_operation"]
    assert (last["kind"], last["status"], last["detail"]["chunks"]) == ("weight_transfer_update", "ok", 1)
    status, info = await call(http, "GET", server.url + "/model_info")
    assert info["weight_version"] == "bcast-2"  # SGLang's own read agrees
    # Leaving the group: SGLang destroys it (a second destroy answers "does not exist").
    status, result = await ctl.call("POST", "/v1/rl/weight_transfer/shutdown", {})
    assert status == 200 and by_worker(result) == {"sglang-0": ("ok", "shutdown_weight_transfer")}, result
    status, answer = await call(
        http, "POST", server.url + "/destroy_weights_update_group", body={"group_name": "weight_update_group"}
    )
    assert status == 400 and "does not exist" in answer["message"], answer


async def test_a_broadcast_that_fails_to_load_never_names_its_version_and_the_disk_copy_is_restored(
    http, server, ctl, refs, tiny_models, tmp_path
):
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("disk-1", tiny_models["weights-1"]))
    assert status == 200, result
    # The trainer declares and sends one tensor an element short: SGLang receives every tensor, loads
    # those before it (weights-2's), then refuses that one ("the full weights ... are partially updated").
    code, log = await broadcast(ctl, tiny_models, tmp_path, "bcast-bad", corrupt=True)
    assert code != 0 and "update -> 502" in log and "partially updated" in log, log
    status, info = await call(http, "GET", server.url + "/model_info")
    # The half-loaded weights are not reported as disk-1 any more (nor as bcast-bad), unless the
    # reconciler already reloaded disk-1 from its disk copy.
    assert info["weight_version"] in (UNNAMED_WEIGHTS, "disk-1"), info
    state = await ctl.state()
    assert state["applied"]["weight_version"] == "disk-1"
    last = state["last_operation"]
    assert last["kind"] == "weight_transfer_update" and last["status"] != "ok", last
    assert "failed an update chunk" in last["detail"]["aborted"], last

    async def restored() -> bool:
        worker = ctl.worker(await ctl.state(), "sglang-0")
        return (worker["weight_version"], worker["serving"]) == ("disk-1", True)

    await wait_for(restored, timeout_s=120, what="the reconciler reloading disk-1 into the half-loaded server")
    ids, meta = await generate(http, server)
    assert ids == refs[1] and meta["weight_version"] == "disk-1"


async def test_a_trainer_that_never_listens_fails_the_join_in_its_deadline_and_sglang_keeps_serving(
    http, server, ctl, refs
):
    """SGLang's own join would wait 30 minutes for the rendezvous, its scheduler blocked: the driver
    waits for the trainer's port within the init's deadline and never asks SGLang to join."""
    driver = ctl.ctl.registry.get("sglang-0").driver
    info = {"master_address": "127.0.0.1", "master_port": free_port(), "world_size": 2, "backend": "gloo"}
    started = asyncio.get_running_loop().time()
    with pytest.raises(WorkerRejected, match="did not accept a connection"):
        await driver.init_weight_transfer(info | {"rank_offset": 1}, 2.0)
    assert asyncio.get_running_loop().time() - started < 10
    assert (await generate(http, server))[0] == refs[1]  # the scheduler was never blocked
    # A trainer on vLLM's wire (its gloo backend's keys) is refused before SGLang is called.
    with pytest.raises(WorkerRejected, match="buffer_size_bytes, timeout_s"):
        await driver.init_weight_transfer(info | {"rank_offset": 1, "timeout_s": 3.0, "buffer_size_bytes": 64}, 2.0)


# -- a mixed fleet ------------------------------------------------------------------------------
async def complete(http, url: str) -> list[int]:
    status, body = await call(
        http,
        "POST",
        url + "/v1/completions",
        timeout_s=120,
        body={
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, (url, body)
    return body["choices"][0]["token_ids"]


@pytest.mark.vllm  # beside SGLang's server, the session's vLLM agent and a stock `vllm serve`
async def test_a_mixed_fleet_of_agent_stock_vllm_and_sglang_is_updated_in_one_call(
    http, server, stock_server, vllm_agent, refs, tiny_models, tmp_path
):
    """Our agent (vLLM), a stock `vllm serve` and SGLang, each driven by its own flavor, under one
    update call: each serves the new weights after it (the vLLM pair agree token for token, SGLang
    gives its reference), and going back restores each one's first output exactly."""
    specs = [
        vllm_agent.spec("agent-0"),
        stock_server.spec("vllm-0"),
        {"id": "sglang-0", "admin_url": server.url, "inference_url": server.url, "flavor": "sglang"},
    ]
    settings = engine_controller_settings(tmp_path, specs, tiny_models, token=vllm_agent.token)
    # Each engine on the base weights first: this test runs no `ctl` of the module's, whose
    # teardown puts the server back there, and the session's agent comes from other modules' tests
    # (a fresh-clone run found it on weights-2 here, left so by one of them).
    await load_direct(http, server, tiny_models["weights-1"], "ref-1")
    await put_back(http, vllm_agent, tiny_models["weights-1"], "base")
    async with serving_controller(settings, reachable_timeout_s=120) as ctl:
        vllm_urls = [vllm_agent.inference_url, stock_server.url]
        before = [await complete(http, u) for u in vllm_urls]
        assert before[0] == before[1]
        ids, meta = await generate(http, server)
        assert ids == refs[1], (meta, ctl.worker(await ctl.state(), "sglang-0"))
        for version, seed in (("mixed-2", 2), ("mixed-1", 1)):
            status, result = await ctl.call(
                "POST",
                "/v1/rl/update_weights",
                update_body(version, tiny_models[f"weights-{seed}"], pause_mode="wait", verify=True),
            )
            assert status == 200, result
            assert by_worker(result) == {w: ("ok", "resume") for w in ("agent-0", "vllm-0", "sglang-0")}
            state = await ctl.state()
            assert state["applied"] == {"weight_version": version, "converged": True, "verified": True}
            assert {w["id"]: w["weight_version"] for w in state["workers"]} == dict.fromkeys(
                ("agent-0", "vllm-0", "sglang-0"), version
            )
            outputs = [await complete(http, u) for u in vllm_urls]
            assert outputs[0] == outputs[1] and (outputs[0] == before[0]) == (seed == 1)
            assert (await generate(http, server))[0] == refs[seed]
        # One broadcast group cannot span both wires: refused up front, saying why, nothing touched.
        init = {"master_address": "127.0.0.1", "master_port": free_port(), "world_size": 4}
        status, refused = await ctl.call("POST", "/v1/rl/weight_transfer/init", {"init_info": init})
        assert status == 409 and refused["error"]["code"] == "capability_missing", refused
        assert "cannot mix SGLang members (sglang-0)" in refused["error"]["message"], refused
        assert "(agent-0, vllm-0)" in refused["error"]["message"] and list(refused["error"]["workers"]) == ["sglang-0"]
        assert (await ctl.state())["weight_transfer"] is None


# -- rollouts through the gateway, and a restart on old weights -----------------------------------
async def test_the_gateway_forwards_inside_the_fence_and_a_restart_on_old_weights_serves_nothing_stale(
    http, server, ctl, refs, tiny_models
):
    status, result = await ctl.call(
        "POST", "/v1/rl/update_weights", update_body("step-2", tiny_models["weights-2"], pause_mode="wait")
    )
    assert status == 200, result
    gateway = ctl.client.server.app[GATEWAY]
    await wait_for(
        lambda: (t := gateway.router.table()) is not None and t.desired == "step-2" and t.routes,
        timeout_s=60,
        what="the member inside the fence at step-2",
    )
    for path, body in (
        (
            "/generate",
            {"text": PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}},
        ),
        (
            "/v1/completions",
            {"model": "tiny", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True},
        ),
        (
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0},
        ),
    ):
        async with http.post(gateway.url + path, json=body) as resp:
            answer = await resp.json()
            assert resp.status == 200, (path, answer)
            assert resp.headers["X-RL-Worker"] == "sglang-0" and resp.headers["X-RL-Weight-Version"] == "step-2"
            spans = json.loads(resp.headers["X-RL-Weight-Versions"])
            assert [[s["version"] for s in c] for c in spans] == [["step-2"]], (path, spans)
        if path == "/generate":
            assert answer["output_ids"] == refs[2]

    # Killed and restarted on the base weights (what a crashed pod comes back with): no answer through
    # the gateway may come from them, while rollouts keep going; the controller reloads it.
    stale: list = []
    served: list = []

    async def rollouts() -> None:
        while True:
            try:
                async with http.post(
                    gateway.url + "/generate",
                    json={
                        "text": PROMPT,
                        "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
                    },
                    timeout=aiohttp.ClientTimeout(total=200),
                ) as resp:
                    if resp.status != 200:
                        continue  # held past the deadline or refused while nothing serves: no answer at all
                    answer = await resp.json()
                    served.append(answer["meta_info"]["weight_version"])
                    if answer["output_ids"] != refs[2] or resp.headers["X-RL-Weight-Version"] != "step-2":
                        stale.append((resp.headers["X-RL-Weight-Version"], answer["meta_info"]))
            except (aiohttp.ClientError, TimeoutError):
                continue

    loop = asyncio.create_task(rollouts())
    try:
        await wait_for(lambda: len(served) >= 3, timeout_s=60, what="rollouts before the kill")
        server.kill()
        await server.spawn().wait_ready_async()  # not blocking the loop the controller runs in
        before = len(served)
        await wait_for(lambda: len(served) >= before + 5, timeout_s=300, what="rollouts after the restart")
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    assert stale == []
    status, info = await call(http, "GET", server.url + "/model_info")
    assert info["weight_version"] == "step-2"  # the reconciler reloaded the restarted server

"""The `dynamo` flavor against Dynamo 1.6.1's own software: Dynamo's own worker entry,
`python -m dynamo.vllm`, on a vLLM CPU engine (rlcp/harness/dynamo.py), and
`python -m dynamo.frontend` listing it on `GET /v1/rl/workers`. The controller finds the worker
only through that listing (`discovery.kind: http_listing`, flavor dynamo) and drives the cycle
the worker's published routes allow; what they do not list (LoRA: the worker runs without
--enable-lora; broadcast: not a capability of the flavor) is refused with a 409 naming the
worker and the capability.

One worker and one frontend for the module (the engine starts in ~30 s); every test leaves the
worker resumed on the base weights. Outputs are greedy requests through the frontend pinned to
the worker (`nvext.backend_instance_id` = its listing's `instance_id`), prompt and completion as
token ids (`nvext.token_data`, `nvext.engine_data`): greedy ids are an exact function of the
weights. Requests in flight are read off the worker's own metrics (its system port's
`/metrics`: Dynamo's `dynamo_component_inflight_requests` of its `generate` endpoint).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, Ctl, controller_settings, update_body, wait_reachable
from rlcp.harness.dynamo import DynamoFrontendProcess, DynamoVllmProcess, dynamo_target
from rlcp.harness.http import call
from rlcp.harness.processes import stop_all
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = [5, 17, 42, 99, 7, 200, 3, 64, 12, 77, 78, 79]  # token ids
LONG_TOKENS = 1000  # the engine's max_model_len is 1024


class Dynamo:
    """The module's worker, its instance id in the frontend's listing, and the frontend."""

    def __init__(self, worker: DynamoVllmProcess, frontend: DynamoFrontendProcess, instance: int) -> None:
        self.worker, self.frontend, self.instance = worker, frontend, instance


@pytest.fixture(scope="module")
def dynamo(tiny_models, tmp_path_factory):
    target = dynamo_target()
    work = tmp_path_factory.mktemp("dynamo")
    kv = work / "kv"
    kv.mkdir()
    worker = DynamoVllmProcess(tiny_models["base"], work / "worker", target=target, kv_dir=kv)
    frontend = DynamoFrontendProcess(work / "frontend", target=target, kv_dir=kv)
    try:
        worker.spawn()
        frontend.spawn()
        worker.wait_ready()
        frontend.wait_ready()

        first = frontend.wait_serving([worker], "tiny")
        yield Dynamo(worker, frontend, int(first[0]["instance_id"]))
    finally:
        stop_all([frontend, worker])


@pytest.fixture
async def http():
    # Above aiohttp's default of 100 connections: N_IN_FLIGHT requests plus the test's own calls.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=200)) as s:
        yield s


async def engine(http, worker, route: str, body: dict | None = None, timeout_s: float = 120) -> dict:
    status, answer = await call(http, "POST", f"{worker.url}/engine/{route}", body=body or {}, timeout_s=timeout_s)
    assert status == 200, (route, status, answer)
    return answer if isinstance(answer, dict) else json.loads(answer)


def request(dynamo: Dynamo, max_tokens: int, **extra: Any) -> dict:
    """Greedy, tokens in and out, pinned to the module's worker; `ignore_eos` (Dynamo's common
    extension) so every request runs to `max_tokens` unless a pause ends it."""
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "-"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
        "nvext": {"token_data": PROMPT, "extra_fields": ["engine_data"], "backend_instance_id": dynamo.instance},
    }


async def generate(http, dynamo: Dynamo, max_tokens: int = 16, timeout_s: float = 300) -> dict:
    """The worker's greedy answer through Dynamo's frontend: completion ids and finish reason."""
    status, body = await call(
        http,
        "POST",
        dynamo.frontend.url + "/v1/chat/completions",
        body=request(dynamo, max_tokens),
        timeout_s=timeout_s,
    )
    assert status == 200, (status, body)
    return {
        "ids": list(body["nvext"]["engine_data"]["completion_token_ids"]),
        "finish_reason": body["choices"][0]["finish_reason"],
    }


def ending(answer: dict, max_tokens: int) -> str:
    """How a request ended: "length" (ran to `max_tokens`) or "abort". Dynamo's frontend answers
    vLLM's `abort` (Dynamo's `cancelled`) with OpenAI's `stop`; with `ignore_eos` and no stop
    strings, a `stop` short of `max_tokens` is that abort and nothing else."""
    n, reason = len(answer["ids"]), answer["finish_reason"]
    if reason == "length" and n == max_tokens:
        return "length"
    if reason == "stop" and n < max_tokens:
        return "abort"
    return f"{reason} after {n} tokens"


INFLIGHT = re.compile(r"^dynamo_component_inflight_requests\{([^}]*)\}\s+(\S+)$", re.M)


async def inflight(http, worker: DynamoVllmProcess) -> int:
    """Requests Dynamo's `generate` endpoint on this worker is handling now, from its own
    Prometheus gauge on the system port (`dynamo.prometheus_names.work_handler.INFLIGHT_REQUESTS`)."""
    status, text = await call(http, "GET", worker.url + "/metrics", timeout_s=10)
    assert status == 200, (status, text)
    found = [float(v) for labels, v in INFLIGHT.findall(text) if 'dynamo_endpoint="generate"' in labels]
    assert found, f"no generate inflight gauge in the worker's /metrics: {text[:2000]}"
    return int(sum(found))


@pytest.fixture
async def ctl(http, dynamo, tiny_models, tmp_path, references):
    worker = dynamo.worker
    if not references:
        references["base"] = (await generate(http, dynamo))["ids"]
    settings = controller_settings(
        tmp_path,
        [],
        allowed_roots=[str(tiny_models["base"].parent)],
        discovery={
            "kind": "http_listing",
            "http_listing": {
                "url": dynamo.frontend.listing_url,
                "interval_s": 0.5,
                "timeout_s": 5,
                "default_flavor": "dynamo",
            },
        },
        workers={
            "token": "unused-by-dynamo",
            "timeout_s": 10,
            "attempts": 2,
            "retry_budget_s": 20,
            "pause_timeout_s": 60,
            "weight_load_timeout_s": 120,
        },
        reconcile={"poll_interval_s": 0.2, "interval_s": 0.2, "backoff_initial_s": 0.5, "backoff_max_s": 4},
    )
    client = TestClient(TestServer(assemble(settings, token=CTL_TOKEN)))
    await client.start_server()
    try:
        c = Ctl(client)
        await wait_reachable(client.session, c.url, workers=1, timeout_s=60, headers=AUTH)
        yield c
    finally:
        await client.close()
        # Leave the worker awake and resumed on the base weights, whatever the test did.
        await engine(http, worker, "control/wake_up")
        await engine(http, worker, "pause_generation", {"mode": "abort"})
        await engine(http, worker, "update_weights_from_disk", {"model_path": str(tiny_models["base"])})
        await engine(http, worker, "resume_generation")


def only_worker(state: dict) -> dict:
    assert len(state["workers"]) == 1, state["workers"]
    return state["workers"][0]


async def test_the_controller_finds_the_worker_through_dynamos_listing(http, dynamo, ctl):
    status, listing = await call(http, "GET", dynamo.frontend.listing_url, timeout_s=10)
    entry = listing["workers"][0]
    assert status == 200 and entry["system_url"] == dynamo.worker.url and entry["world_size"] == 1
    assert {"pause_generation", "resume_generation", "update_weights_from_disk"} <= set(entry["routes"])
    assert "load_lora" not in entry["routes"]  # LoRA off in this worker
    state = await ctl.state()
    assert only_worker(state)["id"] == str(entry["instance_id"])
    # The controller's own listing advertises what this member can do, in Dynamo's names.
    status, ours = await ctl.call("GET", "/v1/rl/workers")
    assert status == 200, ours
    assert ours["workers"][0]["routes"] == [
        "get_weight_version",
        "liveness_probe",
        "pause_generation",
        "resume_generation",
        "update_weights_from_disk",
    ]


async def test_a_disk_update_changes_the_output_and_going_back_restores_it(http, dynamo, ctl, tiny_models, references):
    worker = dynamo.worker
    assert (await generate(http, dynamo))["ids"] == references["base"]
    status, result = await ctl.call(
        "POST", "/v1/rl/update_weights", update_body("step-2", tiny_models["weights-2"], pause_mode="keep", verify=True)
    )
    assert status == 200, result
    changed = (await generate(http, dynamo))["ids"]
    assert changed != references["base"]
    # Dynamo's own read names the version the controller declared.
    assert await engine(http, worker, "get_weight_version") == {
        "status": "ok",
        "version": "step-2",
        "version_declared": True,
    }
    status, result = await ctl.call(
        "POST", "/v1/rl/update_weights", update_body("step-1", tiny_models["base"], pause_mode="keep", verify=True)
    )
    assert status == 200, result
    assert (await generate(http, dynamo))["ids"] == references["base"]

    async def converged() -> dict | None:
        state = await ctl.state()
        return state if state["applied"]["converged"] and only_worker(state)["weight_version"] == "step-1" else None

    state = await wait_for(converged, timeout_s=20, what="the fleet converged on step-1")
    assert state["applied"] == {"weight_version": "step-1", "converged": True, "verified": True}
    assert only_worker(state)["ready"] is True, state


N_IN_FLIGHT = 96  # batched, so each decode step is slower: the tiny model runs ~1000 tokens in < 0.5 s alone


async def in_flight(http, dynamo: Dynamo) -> list[asyncio.Task]:
    """Long greedy generations the engine runs together, none finished: the premise of a pause
    with requests in flight, read off the worker (Dynamo's in-flight gauge of its `generate`
    endpoint), not off a clock.

    They queue behind a keep-mode pause (Dynamo's own route) and start together on its resume.
    Sent to a running engine, they trickled in: on two cores a decoding engine starves the
    test process for seconds (17 s seen), and the first request finished before the last was
    sent."""
    worker = dynamo.worker
    await engine(http, worker, "pause_generation", {"mode": "keep"})
    tasks = [asyncio.create_task(generate(http, dynamo, max_tokens=LONG_TOKENS)) for _ in range(N_IN_FLIGHT)]
    try:

        async def queued() -> bool:
            return any(t.done() for t in tasks) or await inflight(http, worker) == N_IN_FLIGHT

        await wait_for(queued, timeout_s=120, interval_s=0.05, what=f"the worker holding {N_IN_FLIGHT} requests")
        assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]  # raises a task's error
    finally:
        await engine(http, worker, "resume_generation")
    return tasks


async def test_pause_keep_freezes_requests_and_resume_completes_them(http, dynamo, ctl):
    for _ in range(3):  # the premise (some request still running when the pause lands) is about timing
        tasks = await in_flight(http, dynamo)
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
        assert status == 200, result
        frozen = [t for t in tasks if not t.done()]
        if frozen:
            break
        status, result = await ctl.call("POST", "/v1/rl/resume")
        assert status == 200, result
    assert frozen, "every request finished before the pause took hold, three times"
    await asyncio.sleep(1.0)
    assert not any(t.done() for t in frozen), "a keep-mode pause let requests run on"
    status, result = await ctl.call("POST", "/v1/rl/resume")
    assert status == 200, result
    answers = await asyncio.wait_for(asyncio.gather(*tasks), 180)
    assert [ending(a, LONG_TOKENS) for a in answers] == ["length"] * N_IN_FLIGHT  # nothing lost


async def test_pause_abort_ends_requests_and_wait_lets_them_finish(http, dynamo, ctl):
    # A request not yet in the engine when the pause lands waits for the resume (it is not "in
    # flight"), so each mode is judged on the requests the engine held, then all are collected.
    for _ in range(3):  # the premise (some request still running when the pause lands) is about timing
        tasks = await in_flight(http, dynamo)
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
        assert status == 200, result
        await wait_for(lambda: any(t.done() for t in tasks), timeout_s=30, what="an aborted request answered")
        status, result = await ctl.call("POST", "/v1/rl/resume")
        assert status == 200, result
        reasons = [ending(a, LONG_TOKENS) for a in await asyncio.wait_for(asyncio.gather(*tasks), 180)]
        assert set(reasons) <= {"abort", "length"}, reasons
        if "abort" in reasons:
            break
    assert "abort" in reasons, "every request finished before the abort pause took hold, three times"

    tasks = await in_flight(http, dynamo)
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "wait"})
    assert status == 200, result
    # Wait mode answers once the requests the engine was running drained (vLLM's wait mode:
    # those still queued in it wait for the resume), so some finish in full while it is paused.
    await wait_for(lambda: any(t.done() for t in tasks), timeout_s=30, what="a drained request answered")
    drained = [t for t in tasks if t.done()]
    assert [ending(await t, LONG_TOKENS) for t in drained] == ["length"] * len(drained)  # none aborted
    status, result = await ctl.call("POST", "/v1/rl/resume")
    assert status == 200, result
    reasons = [ending(a, LONG_TOKENS) for a in await asyncio.wait_for(asyncio.gather(*tasks), 180)]
    assert reasons == ["length"] * N_IN_FLIGHT


async def test_what_the_worker_does_not_list_is_refused_naming_it(http, dynamo, ctl, tiny_models):
    worker = dynamo.worker
    worker_id = only_worker(await ctl.state())["id"]
    before = await engine(http, worker, "get_weight_version")
    status, body = await ctl.call("POST", "/v1/rl/loras", {"name": "ad", "path": str(tiny_models["lora-11"])})
    assert status == 409, body
    assert body["error"]["workers"] == {worker_id: "lora"} and worker_id in body["error"]["message"], body
    status, body = await ctl.call("POST", "/v1/rl/weight_transfer/init", {"init_info": {"world_size": 2}})
    assert status == 409, body
    assert body["error"]["workers"] == {worker_id: "broadcast"}, body
    assert await engine(http, worker, "get_weight_version") == before  # nothing touched
    assert ending(await generate(http, dynamo), 16) == "length"  # still serving, never paused


async def test_dynamos_refusal_inside_a_200_and_the_drivers_reload_of_a_running_worker(
    http, dynamo, ctl, tiny_models, references
):
    # Dynamo refuses a reload of an unpaused worker in the body of a 200. The reconciler asks
    # the driver for a reload alone (a restarted worker behind the desired version), so the
    # driver pauses (abort) a running worker first, reloads, and resumes it.
    worker = dynamo.worker
    refusal = await engine(http, worker, "update_weights_from_disk", {"model_path": str(tiny_models["weights-2"])})
    assert refusal["status"] == "error" and "paused" in refusal["message"], refusal
    record = ctl.ctl.members()[0]
    await record.driver.update_weights_from_disk(str(tiny_models["weights-2"]), "x")
    assert await engine(http, worker, "get_weight_version") == {
        "status": "ok",
        "version": "x",
        "version_declared": True,
    }
    assert (await generate(http, dynamo))["ids"] != references["base"]  # resumed, on the new weights


async def test_sleep_takes_the_worker_out_of_dynamos_routing_and_a_verified_wake_brings_it_back(http, dynamo, ctl):
    """Dynamo's own `control/sleep` and `control/wake_up` (its worker factory registers them, not
    the RL route list). Its sleep also leaves the frontend's routing, while its RL listing keeps
    the worker, so the controller still sees and wakes it. On the CPU, vLLM ignores the memory
    part (docs/controller.md), so this proves the sequencing: out of service while asleep, a
    partial wake refused up front (Dynamo wakes everything at once), and back in service only
    after the wake, with the same greedy tokens."""
    before = await generate(http, dynamo)
    status, result = await ctl.call("POST", "/v1/rl/sleep", {"level": 1, "mode": "wait"})
    assert status == 200, result
    assert [(r["status"], r["phase"]) for r in result["results"]] == [("ok", "sleep")]
    asleep = only_worker(await ctl.state())
    assert (asleep["sleeping"], asleep["cordoned"], asleep["serving"]) == (True, True, False)
    # Out of Dynamo's own routing: its frontend refuses a request pinned to the sleeper.
    status, body = await call(
        http, "POST", dynamo.frontend.url + "/v1/chat/completions", body=request(dynamo, 4), timeout_s=60
    )
    assert status == 503, (status, body)

    status, answer = await ctl.call("POST", "/v1/rl/wake_up", {"tags": ["weights"]})
    assert status == 409 and answer["error"]["code"] == "capability_missing", answer
    assert f"{asleep['id']} (dynamo)" in answer["error"]["message"]
    assert only_worker(await ctl.state())["sleeping"] is True  # refused before the worker was touched

    status, result = await ctl.call("POST", "/v1/rl/wake_up", {})
    assert status == 200, result
    assert [(r["status"], r["phase"]) for r in result["results"]] == [("ok", "resume")]
    woken = only_worker(await ctl.state())
    assert (woken["sleeping"], woken["serving"], woken["paused"]) == (False, True, False)
    assert await generate(http, dynamo) == before

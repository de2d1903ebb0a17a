"""The `dynamo` flavor against Dynamo 1.6.1's own software: Dynamo's own worker entry,
`python -m dynamo.vllm`, on a vLLM CPU engine (rlcp/harness/dynamo.py), and
`python -m dynamo.frontend` listing it on `GET /v1/rl/workers`. The controller finds the worker
only through that listing (`discovery.kind: http_listing`, flavor dynamo) and drives the cycle
the worker's published routes allow; what they do not list (LoRA: the worker runs without
--enable-lora; broadcast: not a capability of the flavor) is refused with a 409 naming the
worker and the capability.

One worker and the frontend of the session's Dynamo fleet (`dynamo_fleet`, tests/conftest.py:
the engine starts in ~30 s; tests/e2e/test_dynamo_rollouts.py adds a second), the only worker
the frontend lists while this module runs; every test leaves the worker resumed on the base
weights. Outputs are greedy requests through the frontend pinned to the worker
(`nvext.backend_instance_id` = its listing's `instance_id`), prompt and completion as token ids
(`nvext.token_data`, `nvext.engine_data`): greedy ids are an exact function of the weights. The
pause tests hold their requests mid-generation (rlcp/harness/hold.py: the worker loads the
harness's logits processor, and the frontend's token-in/token-out route hands it the request's
`extra_args`) until the pause has landed, and read them running off the worker's own metrics
(its system port's `/metrics`: vLLM's `vllm:num_requests_running`)."""

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
from rlcp.harness.dynamo import DynamoFrontendProcess, DynamoVllmProcess
from rlcp.harness.hold import Hold
from rlcp.harness.http import call
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = [5, 17, 42, 99, 7, 200, 3, 64, 12, 77, 78, 79]  # token ids


class Dynamo:
    """The module's worker, its instance id in the frontend's listing, and the frontend."""

    def __init__(self, worker: DynamoVllmProcess, frontend: DynamoFrontendProcess, instance: int) -> None:
        self.worker, self.frontend, self.instance = worker, frontend, instance


@pytest.fixture(scope="module")
def dynamo(dynamo_fleet):
    """The session's Dynamo fleet (tests/conftest.py), down to its first worker: the only one
    the frontend lists."""
    [worker] = dynamo_fleet.use(1)
    frontend = dynamo_fleet.frontend
    return Dynamo(worker, frontend, int(frontend.listed()[0]["instance_id"]))


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
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


N_HELD = 4
HELD_TOKENS = 100  # held (rlcp/harness/hold.py): 100 steps of 0.2 s at least, 20 s, until let go


async def held_generate(http, dynamo: Dynamo, hold: Hold) -> dict:
    """One greedy request of HELD_TOKENS, held by `hold`, through Dynamo's own token-in/token-out
    route (`/inference/v1/generate`: the frontend hands its `sampling_params` to the worker whole,
    `extra_args` with the hold included; its OpenAI routes refuse `extra_args`). That route has
    no pin, and needs none: the module's worker is the frontend's only one."""
    body = {
        "model": "tiny",
        "token_ids": PROMPT,
        "sampling_params": {"max_tokens": HELD_TOKENS, "temperature": 0, "ignore_eos": True, "extra_args": hold.xargs},
    }
    status, answer = await call(http, "POST", dynamo.frontend.url + "/inference/v1/generate", body=body, timeout_s=300)
    return {"status": status, "answer": answer}


def held_ending(result: dict) -> str:
    """How a held request ended: "length" (ran to HELD_TOKENS) or "abort" (the route's answer to
    a request the engine aborted: 499 `request_cancelled`, no tokens)."""
    status, answer = result["status"], result["answer"]
    if status == 200:
        choice = answer["choices"][0]
        if choice["finish_reason"] == "length" and len(choice["token_ids"]) == HELD_TOKENS:
            return "length"
    if status == 499 and answer.get("error", {}).get("type") == "request_cancelled":
        return "abort"
    return f"{status}: {str(answer)[:300]}"


RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\}\s+(\S+)$", re.M)


async def running(http, worker: DynamoVllmProcess) -> int:
    """Requests in the engine's running batch now: vLLM's own gauge, on the worker's system port."""
    status, text = await call(http, "GET", worker.url + "/metrics", timeout_s=10)
    assert status == 200, (status, text)
    found = [float(v) for v in RUNNING.findall(text)]
    assert found, f"no vllm:num_requests_running in the worker's /metrics: {text[:2000]}"
    return int(sum(found))


async def in_flight(http, dynamo: Dynamo, hold: Hold) -> list[asyncio.Task]:
    """N_HELD held requests, every one in the engine's running batch (vLLM's gauge) and none
    answered: the premise of a pause with requests in flight, certain while `hold` lasts (each
    has HELD_TOKENS steps of 0.2 s at least to run), read off the worker, not off a clock."""
    tasks = [asyncio.create_task(held_generate(http, dynamo, hold)) for _ in range(N_HELD)]

    async def all_running() -> bool:
        return any(t.done() for t in tasks) or await running(http, dynamo.worker) == N_HELD

    await wait_for(all_running, timeout_s=120, what=f"{N_HELD} held requests running", watching=[dynamo.worker])
    assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]  # raises a task's error
    return tasks


async def answers(tasks: list[asyncio.Task]) -> list[str]:
    return [held_ending(r) for r in await asyncio.wait_for(asyncio.gather(*tasks), 180)]


async def test_pause_keep_freezes_requests_and_resume_completes_them(http, dynamo, ctl, tmp_path):
    with Hold(tmp_path / "keep") as hold:
        tasks = await in_flight(http, dynamo, hold)
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
        assert status == 200, result
        assert not any(t.done() for t in tasks), "a request answered before the keep-mode pause took hold"
    # Let go: were the engine stepping, they would now finish in well under a second. The
    # behaviour under test is an absence (none finishes while paused): it can only be watched for
    # a while, so this sleep is the observation window, not a pace.
    await asyncio.sleep(1.0)
    assert not any(t.done() for t in tasks), "a keep-mode pause let requests run on"
    status, result = await ctl.call("POST", "/v1/rl/resume")
    assert status == 200, result
    assert await answers(tasks) == ["length"] * N_HELD  # nothing lost


async def test_pause_abort_ends_requests_and_wait_lets_them_finish(http, dynamo, ctl, tmp_path):
    # abort: every request the engine was running comes back aborted, none errors or hangs.
    with Hold(tmp_path / "abort") as hold:
        tasks = await in_flight(http, dynamo, hold)
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
        assert status == 200, result
        assert await answers(tasks) == ["abort"] * N_HELD
    status, result = await ctl.call("POST", "/v1/rl/resume")
    assert status == 200, result

    # wait: the requests the engine was running when the pause landed finish, in full, while it
    # stays paused. They stay held through the pause (HELD_TOKENS steps of 0.2 s at least), so
    # they were still running when it landed; a pause that froze them (keep) would leave them
    # unanswered until a resume, one that aborted them would answer "abort".
    with Hold(tmp_path / "wait") as hold:
        tasks = await in_flight(http, dynamo, hold)
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "wait"})
        assert status == 200, result
        assert await answers(tasks) == ["length"] * N_HELD  # still paused: no resume yet
    status, result = await ctl.call("POST", "/v1/rl/resume")
    assert status == 200, result


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

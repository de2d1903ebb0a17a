"""The inference gateway over real agents on SimEngine (their admin and OpenAI ports on loopback),
inside a real controller: the version fence, holding through a pause, 503 with Retry-After,
session affinity across a member leaving, failover before the first byte, an error event
when a worker dies mid-stream, a client that hangs up, and bad input refused before any worker."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from rlcp.controlplane.assembly import GATEWAY
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import AUTH, TEST_WORKER_CALLS, start_controller, update_body
from rlcp.harness.faults import Fault
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import FleetShape

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fleet_shape() -> FleetShape:
    """Three workers (a member can leave with two still serving), a token every 10 ms (a stream
    long enough to cut mid-way)."""
    return FleetShape(agents=3, engine={"token_interval_s": 0.01})


def completion(**extra) -> dict:
    return {"model": "sim", "prompt": "hello", "max_tokens": 4} | extra


def first_token_event(agents: list[SimAgent]) -> asyncio.Event:
    """Set when any agent's engine has made the first token of a request (a hook on the engine
    seam, as the inference port calls it)."""
    made = asyncio.Event()
    for agent in agents:
        real = agent.engine.generate

        async def generate(*args: Any, _real: Any = real, **kw: Any) -> AsyncIterator[Any]:
            async for output in _real(*args, **kw):
                if output.token_ids:
                    made.set()
                yield output

        agent.engine.generate = generate  # type: ignore[method-assign]
    return made


async def post(http: aiohttp.ClientSession, gateway, body: dict, headers: dict | None = None):
    async with http.post(f"{gateway.url}/v1/completions", json=body, headers=headers or {}) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def test_every_answer_names_its_worker_and_version_and_the_fence_keeps_stale_ones_out(gateway_fleet, tmp_path):
    agents, ctl, gateway, http = gateway_fleet
    status, headers, body = await post(http, gateway, completion())
    assert status == 200 and body["choices"][0]["text"] and headers["X-RL-Worker"] in {"w0", "w1", "w2"}
    write_checkpoint(tmp_path / "v1", 1)
    write_checkpoint(tmp_path / "v2", 2)
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", tmp_path / "v1"))
    assert status == 200, result
    agents[1].faults.add("POST", "/v1/agent/weights/update", Fault("status", 500))  # the update's call
    agents[1].faults.add("POST", "/v1/agent/weights/disk", Fault("status", 500))  # the reconciler's load
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v2", tmp_path / "v2"))
    assert status == 207, result
    await wait_for(lambda: gateway.router.table().desired == "v2", what="the fence at v2")
    served = [await post(http, gateway, completion()) for _ in range(30)]
    assert all(s == 200 for s, _, _ in served)
    assert {h["X-RL-Worker"] for _, h, _ in served} == {"w0", "w2"}  # w1 failed its load: outside the fence
    assert {h["X-RL-Weight-Version"] for _, h, _ in served} == {"v2"}
    state = await ctl.state()
    view = {w["worker_id"]: w for w in state["gateway"]["workers"]}
    assert state["gateway"]["allowed_versions"] == ["v2"] and not view["w1"]["in_fence"] and view["w0"]["in_fence"]
    # w1 back in service at the previous weights (resumed by hand, still failing its load): a request
    # that accepts one version of staleness may go there, one that does not never does.
    async with http.post(f"{agents[1].url}/resume", headers={"Authorization": "Bearer agent-token"}) as resp:
        assert resp.status == 200
    await wait_for(lambda: ctl.ctl.registry.get("w1").status.paused is False, what="w1 resumed")
    stale = [await post(http, gateway, completion(), {"X-RL-Max-Staleness": "1"}) for _ in range(30)]
    assert "w1" in {h["X-RL-Worker"] for _, h, _ in stale}
    assert {h["X-RL-Weight-Version"] for _, h, _ in stale} == {"v1", "v2"}
    fresh = [await post(http, gateway, completion()) for _ in range(20)]
    assert "w1" not in {h["X-RL-Worker"] for _, h, _ in fresh}


# A state read of w1 that hangs keeps the controller's view of w1 as it was for as long as the read
# waits: a minute here, past the test's own end. With the tests' 2 s (`TEST_WORKER_CALLS`) the read
# gave up mid-test and took w1 out of the fence: 30 requests take ~1.4 s on an idle machine, and at
# load 12 only 3 had reached w1 when it left ("assert 3 > 5", gw4's run of the gateway suite).
STALE_VIEW = FleetShape(
    agents=3,
    engine={"token_interval_s": 0.01},
    settings={"workers": {"token": AGENT_TOKEN, **TEST_WORKER_CALLS, "timeout_s": 60}},
)


@pytest.mark.parametrize("fleet_shape", [STALE_VIEW])
async def test_a_worker_whose_weights_changed_behind_the_fence_refuses_and_another_serves(gateway_fleet, tmp_path):
    # The controller's view of w1 goes stale (its state reads hang), then w1's weights change
    # behind its back, as when an agent restarts on its base weights at the same address.
    agents, ctl, gateway, http = gateway_fleet
    agents[1].faults.add("GET", "/v1/agent/state", Fault("hang"))
    # Once a poll hangs there, the view keeps w1 as it was.
    await wait_for(lambda: agents[1].faults.fired("GET", "/v1/agent/state"), what="a state read of w1 hanging")
    agents[1].engine.served_version = "rogue"
    assert "w1" in gateway.router.table().routes
    answers = [await post(http, gateway, completion()) for _ in range(30)]
    assert all(s == 200 for s, _, _ in answers), answers
    assert "w1" not in {h["X-RL-Worker"] for _, h, _ in answers}
    # Sent there (the fence still admitted it) and refused, more often than the failures in a row
    # that eject a worker; a refusal is the agent's own answer, not a fault, so it stays in rotation.
    assert gateway.failed["w1"] > gateway.settings.outlier_failures
    assert gateway.breakers.view("w1").state == "closed"
    # The agent's refusal, as any client sending the header sees it:
    async with http.post(
        f"http://127.0.0.1:{agents[1].inference_port}/v1/completions",
        json=completion(),
        headers={"X-RL-Expect-Weight-Version": "default"},
    ) as resp:
        body = await resp.json()
        assert resp.status == 409 and body["error"]["code"] == "weight_version_mismatch", body
        assert body["error"]["field"] == "X-RL-Expect-Weight-Version" and "rogue" in body["error"]["message"]


@pytest.mark.parametrize("fleet_shape", [STALE_VIEW])
async def test_a_refusing_member_is_tried_once_per_request_even_while_it_is_the_least_loaded(gateway_fleet):
    """A member that refuses at once (here for its weights) is the least loaded one whenever the
    others are busy: each request tries it once, then goes to another member, never back to it
    (every try going to it was a 502 in a loaded fleet: a restarted engine refusing at once)."""
    agents, ctl, gateway, http = gateway_fleet
    agents[1].faults.add("GET", "/v1/agent/state", Fault("hang"))
    await wait_for(lambda: agents[1].faults.fired("GET", "/v1/agent/state"), what="a state read of w1 hanging")
    agents[1].engine.served_version = "rogue"
    # w0 and w2 each hold one request that never ends, so w1 has the least load from now on.
    busy = (agents[0], agents[2])
    for agent in busy:
        agent.inference_faults.add("POST", "/v1/completions", Fault("hang", times=1))
    held = [asyncio.create_task(post(http, gateway, completion())) for _ in busy]
    try:
        await wait_for(
            lambda: all(a.inference_faults.fired("POST", "/v1/completions") for a in busy),
            what="a request hanging on each of w0 and w2",
        )
        refused_before = gateway.failed["w1"]
        answers = [await post(http, gateway, completion()) for _ in range(10)]
        assert [s for s, _, _ in answers] == [200] * 10, answers
        assert {h["X-RL-Worker"] for _, h, _ in answers} <= {"w0", "w2"}
        assert gateway.failed["w1"] - refused_before == 10  # one refusal per request, no more
    finally:
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_a_keep_mode_request_across_an_update_says_which_weights_made_which_tokens(gateway_fleet, tmp_path):
    agents, ctl, gateway, http = gateway_fleet
    write_checkpoint(tmp_path / "v1", 1)
    write_checkpoint(tmp_path / "v2", 2)
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", tmp_path / "v1"))
    assert status == 200, result
    await wait_for(lambda: gateway.router.table().desired == "v1", what="the fence at v1")
    status, headers, _ = await post(http, gateway, completion())
    assert status == 200 and json.loads(headers["X-RL-Weight-Versions"]) == [[{"version": "v1", "start": 0, "end": 4}]]
    # A long request under way when a keep-mode update lands: frozen, then finished on v2.
    first_token = first_token_event(agents)
    request = asyncio.create_task(post(http, gateway, completion(max_tokens=100)))
    async with asyncio.timeout(10):
        await first_token.wait()  # some of its tokens are v1's
    status, result = await ctl.call(
        "POST", "/v1/rl/update_weights", update_body("v2", tmp_path / "v2", pause_mode="keep")
    )
    assert status == 200, result
    status, headers, body = await request
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert headers["X-RL-Weight-Version"] == "v1"  # what the fence admitted it at
    ((first, second),) = json.loads(headers["X-RL-Weight-Versions"])
    assert (first["version"], first["start"], second["version"], second["end"]) == ("v1", 0, "v2", 100), headers
    assert 0 < first["end"] == second["start"] < 100


async def test_requests_are_held_through_a_pause_and_released_on_resume(gateway_fleet):
    agents, ctl, gateway, http = gateway_fleet
    status, _ = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    assert status == 200
    await wait_for(lambda: not gateway.router.table().routes, what="the fence empty while paused")
    held = [asyncio.create_task(post(http, gateway, completion())) for _ in range(5)]
    await wait_for(lambda: gateway.held == 5, what="five requests held")
    assert not any(t.done() for t in held)
    status, _ = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200
    answers = await asyncio.wait_for(asyncio.gather(*held), 20)
    assert all(s == 200 and h["X-RL-Worker"] for s, h, _ in answers) and gateway.held == 0


async def test_past_the_hold_deadline_the_answer_is_503_with_retry_after_and_why(gateway_fleet):
    agents, ctl, gateway, http = gateway_fleet
    await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
    await wait_for(lambda: not gateway.router.table().routes, what="the fence empty while paused")
    status, headers, body = await post(http, gateway, completion(), {"X-RL-Hold-Timeout": "0.3"})
    assert status == 503 and headers["Retry-After"] == "1"
    assert body["error"]["code"] == "no_capacity" and "paused" in body["error"]["message"]
    assert gateway.rejected == 1 and all(a.engine.request_counts().running == 0 for a in agents)


async def test_a_session_keeps_its_worker_and_only_the_leavers_sessions_move(gateway_fleet, tmp_path):
    agents, ctl, gateway, http = gateway_fleet
    sessions = [f"rollout-{i}" for i in range(24)]

    async def where(session: str) -> str:
        _, headers, _ = await post(http, gateway, completion(), {"X-RL-Session": session})
        return headers["X-RL-Worker"]

    before = {s: await where(s) for s in sessions}
    assert len(set(before.values())) == 3 and before == {s: await where(s) for s in sessions}
    assert await where("rollout-0") == before["rollout-0"]
    # The body's `user` is a session key too.
    _, h1, _ = await post(http, gateway, completion(user="rollout-7"))
    assert h1["X-RL-Worker"] == before["rollout-7"]
    ctl.ctl.apply_membership([WorkerSpec(**a.spec()) for a in agents[:2]])  # w2 leaves the fleet
    await wait_for(lambda: set(gateway.router.table().routes) == {"w0", "w1"}, what="w2 out of the fence")
    after = {s: await where(s) for s in sessions}
    assert all(after[s] == before[s] for s in sessions if before[s] != "w2")
    assert all(after[s] in {"w0", "w1"} for s in sessions)


async def test_a_steps_rollouts_share_a_cache_salt_and_still_spread(gateway_fleet):
    """prime-rl sets `cache_salt` to the policy version, the same for every rollout of a step:
    a cache-isolation salt, not a session. Sessions come from the headers (verifiers sends
    `X-Session-ID`, the rollout's trace id); without one, rollouts spread by load."""
    agents, ctl, gateway, http = gateway_fleet
    salted = completion(cache_salt="policy-v3", max_tokens=20)
    answers = await asyncio.gather(*(post(http, gateway, salted) for _ in range(9)))
    assert all(status == 200 for status, _, _ in answers)
    assert set(Counter(h["X-RL-Worker"] for _, h, _ in answers)) == {"w0", "w1", "w2"}

    async def where(headers: dict[str, str]) -> str:  # one token: where it went is the answer
        _, answer_headers, _ = await post(http, gateway, salted | {"max_tokens": 1}, headers)
        return answer_headers["X-RL-Worker"]

    sessions = [f"trace-{i}" for i in range(24)]
    by_id = {s: await where({"X-Session-ID": s}) for s in sessions}
    assert len(set(by_id.values())) == 3  # one salt, every member
    assert by_id == {s: await where({"X-Session-ID": s}) for s in sessions}  # each session keeps its worker
    # The configured affinity header comes first; X-Session-ID names the same session as it would.
    assert by_id == {s: await where({"X-RL-Session": s}) for s in sessions}
    assert await where({"X-RL-Session": "trace-0", "X-Session-ID": "other"}) == by_id["trace-0"]


async def test_a_worker_that_fails_before_the_first_byte_is_skipped(gateway_fleet):
    agents, ctl, gateway, http = gateway_fleet
    await agents[0].inference_runner.cleanup()  # its OpenAI port is gone; its admin port still answers
    answers = [await post(http, gateway, completion()) for _ in range(12)]
    assert all(s == 200 for s, _, _ in answers)
    assert {h["X-RL-Worker"] for _, h, _ in answers} <= {"w1", "w2"}
    assert gateway.failed["w0"] >= 1


async def test_a_worker_dying_mid_stream_ends_the_stream_with_an_error_event(gateway_fleet):
    agents, ctl, gateway, http = gateway_fleet
    events: list[str] = []
    async with http.post(
        f"{gateway.url}/v1/completions", json=completion(max_tokens=400, stream=True), headers={"X-RL-Session": "s"}
    ) as resp:
        assert resp.status == 200 and resp.headers["X-RL-Worker"]
        victim = next(a for a in agents if a.agent_id == resp.headers["X-RL-Worker"])
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line[6:].decode().strip())
                if len(events) == 3:
                    await victim.inference_runner.shutdown()  # the worker's connections drop
                    await victim.inference_runner.cleanup()
    assert len(events) > 3
    last = json.loads(events[-1])
    assert last["error"]["code"] == "worker_failed" and last["error"]["worker"] == victim.agent_id


async def test_a_client_that_hangs_up_cancels_its_upstream_request(gateway_fleet):
    agents, ctl, gateway, http = gateway_fleet
    async with aiohttp.ClientSession() as once:
        resp = await once.post(f"{gateway.url}/v1/completions", json=completion(max_tokens=2000, stream=True))
        worker = next(a for a in agents if a.agent_id == resp.headers["X-RL-Worker"])
        await resp.content.readline()
        await wait_for(lambda: worker.engine.request_counts().running == 1, what="the request running")
        resp.close()  # the client goes away mid-stream
    await wait_for(lambda: worker.engine.request_counts().running == 0, what="the upstream request cancelled")
    await wait_for(lambda: gateway.in_flight[worker.agent_id] == 0, what="nothing in flight")


@pytest.mark.parametrize(
    ("headers", "body", "field"),
    [
        ({}, b"not json", "body"),
        ({}, b"[1, 2]", "body"),
        ({}, json.dumps(completion(stream="yes")).encode(), "stream"),
        ({}, json.dumps(completion(stream=1)).encode(), "stream"),
        ({}, json.dumps(completion(user=7)).encode(), "user"),
        ({}, json.dumps(completion(model=["sim"])).encode(), "model"),
        ({"X-RL-Max-Staleness": "-1"}, json.dumps(completion()).encode(), "X-RL-Max-Staleness"),
        ({"X-RL-Max-Staleness": "two"}, json.dumps(completion()).encode(), "X-RL-Max-Staleness"),
        ({"X-RL-Hold-Timeout": "0"}, json.dumps(completion()).encode(), "X-RL-Hold-Timeout"),
    ],
)
async def test_bad_input_is_refused_before_any_worker(gateway_fleet, headers, body, field):
    agents, ctl, gateway, http = gateway_fleet
    async with http.post(
        f"{gateway.url}/v1/completions", data=body, headers={"Content-Type": "application/json", **headers}
    ) as resp:
        answer = await resp.json()
        assert resp.status in (400, 422) and answer["error"]["field"] == field, answer
    assert sum(gateway.routed.values()) == 0


async def test_models_are_the_union_of_the_members_and_probes_say_why(gateway_fleet):
    agents, ctl, gateway, http = gateway_fleet
    async with http.get(f"{gateway.url}/v1/models") as resp:
        assert resp.status == 200 and [c["id"] for c in (await resp.json())["data"]] == ["sim"]
    async with http.get(f"{gateway.url}/readyz") as resp:
        assert resp.status == 200
    await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    await wait_for(lambda: not gateway.router.table().routes, what="the fence empty while paused")
    async with http.get(f"{gateway.url}/readyz") as resp:
        assert resp.status == 503 and "paused" in (await resp.json())["reason"]
    async with http.get(f"{gateway.url}/metrics") as resp:
        assert "rlcp_gateway_routed" in await resp.text()


@pytest.mark.parametrize("accept_admin_token", [True, False])
async def test_an_inference_token_and_the_admin_one(tmp_path, accept_admin_token):
    """With its own token set, the gateway takes it, and the controller's admin token unless told
    not to (trainers such as prime-rl send one API key to the admin and the inference URL)."""
    agent = await SimAgent("w0", [tmp_path], serve_inference=True).start()
    ctl = await start_controller(
        tmp_path, [agent], gateway={"port": 0, "token": "rollout-token", "accept_admin_token": accept_admin_token}
    )
    gateway = ctl.client.server.app[GATEWAY]
    try:
        await wait_for(lambda: bool(gateway.router.table() and gateway.router.table().routes), what="fence")
        async with aiohttp.ClientSession() as http:
            cases = (
                (None, 401),
                ("Bearer guess", 401),
                (AUTH["Authorization"], 200 if accept_admin_token else 401),
                ("Bearer rollout-token", 200),
            )
            for token, expected in cases:
                headers = {"Authorization": token} if token else {}
                async with http.post(f"{gateway.url}/v1/completions", json=completion(), headers=headers) as resp:
                    assert resp.status == expected, (token, await resp.text())
            for probe in ("/healthz", "/health"):
                async with http.get(f"{gateway.url}{probe}") as resp:
                    assert resp.status == 200, probe  # probes stay open
    finally:
        await ctl.client.close()
        await agent.stop()

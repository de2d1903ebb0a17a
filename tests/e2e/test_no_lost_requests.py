"""No lost requests across a pause, on a real vLLM CPU engine (docs/reliability.md, "No lost requests"):

- keep mode: 64 streaming completions in flight are frozen by the pause and, after the
  resume, every one completes with its full requested length (`ignore_eos`), none errors;
- abort mode: every one of the 64 comes back with `finish_reason: "abort"`, none hangs.

Every request is still running when the pause lands, for certain: the streams are held
(rlcp/harness/hold.py: each engine step takes 0.2 s longer while the test's hold file exists, so
192 tokens take 38 s at least) until the pause has landed, then let go.

Each mode runs twice: through the agent's admin API, and through the controller (in-process,
over that one agent). The agent is the session's shared `vllm_agent`; no engine is started here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.settings import ControllerSettings
from rlcp.harness.figures import record_figures
from rlcp.harness.hold import Hold
from rlcp.harness.http import CompletionStream, call, settled
from rlcp.harness.processes import AgentProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

N_REQUESTS = 64
MAX_TOKENS = 192  # held, 38 s at least (the prompt is ~20 tokens; max_model_len is 1024)
CTL_TOKEN = "ctl-token"
CTL_AUTH = {"Authorization": f"Bearer {CTL_TOKEN}"}


@pytest.fixture
async def http():
    # One connection per stream, never a pooled one the server may have closed meanwhile.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=N_REQUESTS + 8, force_close=True)) as session:
        yield session


@pytest.fixture
async def agent(vllm_agent: AgentProcess, http):
    """The shared agent, resumed, gating on no desired version; left the same way."""

    async def reset() -> None:
        await call(http, "POST", vllm_agent.admin_url + "/resume", headers=vllm_agent.auth)
        await call(
            http,
            "PUT",
            vllm_agent.admin_url + "/v1/agent/desired",
            headers=vllm_agent.auth,
            body={"weight_version": None},
        )

    await reset()
    yield vllm_agent
    await reset()


@pytest.fixture
async def controller(agent: AgentProcess, tmp_path):
    """A controller (in-process) whose fleet is that one agent."""
    settings = ControllerSettings(
        api={"token": CTL_TOKEN},
        gateway={"port": 0},
        discovery={
            "kind": "static",
            "static": [{"id": "vllm-0", "admin_url": agent.admin_url, "inference_url": agent.inference_url}],
        },
        workers={"token": agent.token, "timeout_s": 10, "pause_timeout_s": 60},
        reconcile={"poll_interval_s": 0.5, "interval_s": 0.5},
        store={"kind": "memory"},
        allowed_roots=[str(tmp_path)],
        log_format="console",
        log_level="warning",
    )
    client = TestClient(TestServer(assemble(settings, token=CTL_TOKEN)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def agent_state(http: aiohttp.ClientSession, agent: AgentProcess) -> dict:
    status, body = await call(http, "GET", agent.admin_url + "/v1/agent/state")
    assert status == 200, body
    return body


async def start_streams(http: aiohttp.ClientSession, agent: AgentProcess, hold: Hold) -> list[CompletionStream]:
    """64 held streams, each seen generating (so running in the engine, not queued) before returning."""
    streams = [
        CompletionStream(
            http,
            agent.inference_url,
            f"Request {i}: the quick brown fox jumps over the lazy dog.",
            max_tokens=MAX_TOKENS,
            xargs=hold.xargs,
        )
        for i in range(N_REQUESTS)
    ]
    async with asyncio.timeout(90):
        while not all(len(s.tokens) >= 2 or s.task.done() for s in streams):
            await asyncio.sleep(0.02)
    assert not [s.error for s in streams if s.error], [s.error for s in streams if s.error]
    return streams


Toggle = Callable[[str], Awaitable[None]]


def via_agent(http: aiohttp.ClientSession, agent: AgentProcess) -> tuple[Toggle, Toggle]:
    async def pause(mode: str) -> None:
        status, body = await call(http, "POST", f"{agent.admin_url}/pause?mode={mode}", headers=agent.auth)
        assert (status, body) == (200, {"status": "paused"}), body

    async def resume(_: str = "") -> None:
        status, body = await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
        assert status == 200, body

    return pause, resume


def via_controller(client: TestClient) -> tuple[Toggle, Toggle]:
    async def pause(mode: str) -> None:
        resp = await client.post("/v1/rl/pause", json={"mode": mode, "timeout_s": 60}, headers=CTL_AUTH)
        body = await resp.json()
        assert resp.status == 200 and body["status"] == "ok", body
        assert [(r["worker_id"], r["phase"], r["status"]) for r in body["results"]] == [("vllm-0", "pause", "ok")]

    async def resume(_: str = "") -> None:
        resp = await client.post("/v1/rl/resume", headers=CTL_AUTH)
        body = await resp.json()
        assert resp.status == 200 and body["status"] == "ok", body

    return pause, resume


async def paused_in_flight(
    http: aiohttp.ClientSession, agent: AgentProcess, pause: Toggle, mode: str, hold: Hold
) -> tuple[list[CompletionStream], float]:
    """64 held streams under way, paused in `mode`, then let go; and how long the pause took."""
    with hold:
        streams = await start_streams(http, agent, hold)
        t0 = time.monotonic()
        await pause(mode)
        return streams, time.monotonic() - t0


async def keep_cycle(
    http: aiohttp.ClientSession, agent: AgentProcess, pause: Toggle, resume: Toggle, hold: Hold
) -> dict:
    streams, paused_s = await paused_in_flight(http, agent, pause, "keep", hold)
    st = await agent_state(http, agent)
    assert st["paused"] is True, st
    # Every request is held in the engine (frozen), none dropped.
    assert st["requests"] == {"running": 0, "waiting": 0, "frozen": N_REQUESTS}, st["requests"]
    frozen_at = await settled(streams)
    await asyncio.sleep(0.5)
    assert [len(s.tokens) for s in streams] == frozen_at, "a frozen request generated while paused"
    t1 = time.monotonic()
    await resume("")
    async with asyncio.timeout(120):
        await asyncio.gather(*(s.task for s in streams))
    completed_s = time.monotonic() - t1
    errors = [s.error for s in streams if s.error]
    assert not errors, errors
    short = [(s.finish_reason, len(s.tokens)) for s in streams if not s.full]
    assert not short, f"requests that did not complete with {MAX_TOKENS} tokens: {short}"
    return {
        "requests": N_REQUESTS,
        "max_tokens": MAX_TOKENS,
        "frozen_at_pause": st["requests"]["frozen"],
        "completed_full_length": N_REQUESTS,
        "pause_s": round(paused_s, 3),
        "resume_to_all_complete_s": round(completed_s, 2),
    }


async def abort_cycle(
    http: aiohttp.ClientSession, agent: AgentProcess, pause: Toggle, resume: Toggle, hold: Hold
) -> dict:
    streams, paused_s = await paused_in_flight(http, agent, pause, "abort", hold)
    t1 = time.monotonic()
    try:
        async with asyncio.timeout(60):  # none hangs
            await asyncio.gather(*(s.task for s in streams))
        returned_s = paused_s + time.monotonic() - t1  # from the pause call
        errors = [s.error for s in streams if s.error]
        assert not errors, errors
        odd = [(s.finish_reason, len(s.tokens)) for s in streams if s.finish_reason != "abort"]
        assert not odd, f"not aborted: {odd}"
        assert all(2 <= len(s.tokens) < MAX_TOKENS for s in streams)  # partial output, returned to its client
        st = await agent_state(http, agent)
        assert st["paused"] is True and st["requests"] == {"running": 0, "waiting": 0, "frozen": 0}, st
    finally:
        await resume("")
    return {
        "requests": N_REQUESTS,
        "max_tokens": MAX_TOKENS,
        "aborted": N_REQUESTS,
        "pause_s": round(paused_s, 3),
        "pause_to_all_returned_s": round(returned_s, 2),
    }


async def test_keep_mode_loses_no_request_via_agent(http, agent, tmp_path):
    pause, resume = via_agent(http, agent)
    figures = await keep_cycle(http, agent, pause, resume, Hold(tmp_path / "hold"))
    record_figures("no_lost_requests", "keep_via_agent", figures)


async def test_abort_mode_returns_every_request_via_agent(http, agent, tmp_path):
    pause, resume = via_agent(http, agent)
    figures = await abort_cycle(http, agent, pause, resume, Hold(tmp_path / "hold"))
    record_figures("no_lost_requests", "abort_via_agent", figures)


async def test_keep_mode_loses_no_request_via_controller(http, agent, controller, tmp_path):
    pause, resume = via_controller(controller)
    figures = await keep_cycle(http, agent, pause, resume, Hold(tmp_path / "hold"))
    record_figures("no_lost_requests", "keep_via_controller", figures)


async def test_abort_mode_returns_every_request_via_controller(http, agent, controller, tmp_path):
    pause, resume = via_controller(controller)
    figures = await abort_cycle(http, agent, pause, resume, Hold(tmp_path / "hold"))
    record_figures("no_lost_requests", "abort_via_controller", figures)

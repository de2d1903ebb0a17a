"""The agent's pause modes on a real vLLM CPU engine (tiny Llama made at test time): a `keep`
request survives a disk update, `abort` ends what runs and nothing hangs, `wait` drains, and a
conflicting operation gets a 409 (a short deadline a 504).

Each premise "a request is still running when the pause lands" is made certain, not likely: the
requests are held (rlcp/harness/hold.py: every engine step takes 0.2 s longer while the test's
hold file exists, so a request of 200 tokens runs for 40 s at least) until the pause has landed,
then let go to finish at full speed.

The engine is the session's (`vllm_agent`, tests/conftest.py: start-up costs ~30 s), so each test
first puts it in the state it needs (`agent`, conftest.py) instead of assuming an order."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlcp.harness.hold import STEP_S, Hold
from rlcp.harness.http import call, settled
from tests.agent.engine.vllm_support import PROMPT, complete, held_stream, state, tokenize

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


async def test_a_held_request_is_slowed_until_let_go_and_answers_the_same(http, agent, tmp_path):
    # What the other tests rely on (rlcp/harness/hold.py). A lower bound only: a slow machine makes
    # the held request slower still, and only a hold that holds nothing makes it faster.
    free = (await complete(http, agent, PROMPT, 10))["token_ids"]
    with Hold(tmp_path / "hold") as hold:
        started = time.monotonic()
        held = (await complete(http, agent, PROMPT, 10, vllm_xargs=hold.xargs))["token_ids"]
        assert time.monotonic() - started >= 10 * STEP_S, "each of its 10 steps must take STEP_S longer"
    assert held == free, "a hold changes no logit"
    status, body = await call(
        http,
        "POST",
        agent.inference_url + "/v1/completions",
        body={"model": "tiny", "prompt": PROMPT, "vllm_xargs": {"hold": "x"}},
    )
    assert status == 400 and "absolute path" in str(body), (status, body)


async def test_keep_mode_request_survives_disk_update(http, agent, tiny_models, tmp_path):
    prompt_ids = await tokenize(http, agent, PROMPT)
    total = 200
    before = (await complete(http, agent, prompt_ids, total))["token_ids"]  # all on weights A

    with Hold(tmp_path / "hold") as hold:
        stream = held_stream(http, agent, prompt_ids, total, hold)
        await stream.wait_for_tokens(5)
        status, _ = await call(http, "POST", agent.admin_url + "/pause?mode=keep", headers=agent.auth)
        assert status == 200
        seen_before_pause = len(stream.tokens)
        st = await state(http, agent)
        assert st["paused"] is True and st["requests"]["frozen"] == 1, st["requests"]
    [frozen_at] = await settled([stream])  # chunks generated before the pause may still be in flight
    await asyncio.sleep(0.5)
    assert len(stream.tokens) == frozen_at, "a frozen request must not generate"
    assert 5 <= frozen_at < total

    status, body = await call(
        http,
        "POST",
        agent.admin_url + "/v1/agent/weights/disk",
        headers=agent.auth,
        body={"path": str(tiny_models["weights-2"]), "version": "B"},
    )
    assert (status, body["weight_version"]) == (200, "B")
    assert (await state(http, agent))["requests"]["frozen"] == 1, "the update must not drop the frozen request"
    status, _ = await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
    assert status == 200
    async with asyncio.timeout(60):
        await stream.task

    assert stream.finish_reason == "length" and len(stream.tokens) == total, stream.error
    # Before the pause: weights A. After the resume: exactly what weights B produce from
    # the same prefix (the request was recomputed, not continued on stale KV). The split is
    # where the stream leaves A's tokens: at or after what was generated before the pause
    # (B may happen to repeat A's next token; B's continuation from any later point is the same).
    split = next((i for i, (x, y) in enumerate(zip(stream.tokens, before)) if x != y), total)
    assert seen_before_pause <= frozen_at <= split < total, "the continuation must come from weights B"
    assert split <= frozen_at + 2  # B's first tokens may coincide with A's, rarely more than one
    after = (await complete(http, agent, prompt_ids + stream.tokens[:split], total - split))["token_ids"]
    assert stream.tokens[split:] == after


async def test_abort_mode_returns_abort_and_nothing_hangs(http, agent, tmp_path):
    with Hold(tmp_path / "hold") as hold:
        streams = [held_stream(http, agent, f"{PROMPT} {i}", 200, hold) for i in range(3)]
        for s in streams:
            await s.wait_for_tokens(3)
        status, body = await call(http, "POST", agent.admin_url + "/pause?mode=abort", headers=agent.auth)
        assert (status, body) == (200, {"status": "paused"})
    async with asyncio.timeout(20):  # none hangs
        await asyncio.gather(*(s.task for s in streams))
    # Every one comes back aborted, with its partial output.
    assert [s.finish_reason for s in streams] == ["abort"] * 3, [s.error for s in streams]
    assert all(3 <= len(s.tokens) < 200 for s in streams), [len(s.tokens) for s in streams]
    st = await state(http, agent)
    assert st["paused"] is True
    assert st["requests"] == {"running": 0, "waiting": 0, "frozen": 0}
    status, body = await call(http, "GET", agent.admin_url + "/is_paused")
    assert body == {"is_paused": True}
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
    assert len((await complete(http, agent, PROMPT, 8))["token_ids"]) == 8


async def _pausing(http, agent, query: str) -> asyncio.Task:
    """A pause under way: posted, and the agent running it (two connections have no order)."""
    pause = asyncio.create_task(call(http, "POST", agent.admin_url + f"/pause?{query}", headers=agent.auth))
    while not pause.done() and (await state(http, agent))["busy_with"] != "pause":
        await asyncio.sleep(0.005)
    return pause


async def test_wait_mode_drains(http, agent, tmp_path):
    # Tokens flowing proves the requests run (vLLM's wait mode drains running requests;
    # a queued one would stay queued until resume).
    with Hold(tmp_path / "hold") as hold:
        streams = [held_stream(http, agent, f"{PROMPT} {i}", 150, hold) for i in range(2)]
        for s in streams:
            await s.wait_for_tokens(2)
        pause = await _pausing(http, agent, "mode=wait")
        assert not pause.done() and not any(s.task.done() for s in streams), "the pause must wait for them"
    status, _ = await pause  # let go: the requests finish, and the pause with them
    assert status == 200
    st = await state(http, agent)
    assert st["paused"] is True and st["requests"] == {"running": 0, "waiting": 0, "frozen": 0}
    async with asyncio.timeout(10):  # their last chunks may still be on the way to this process
        await asyncio.gather(*(s.task for s in streams))
    assert [(s.finish_reason, len(s.tokens)) for s in streams] == [("length", 150)] * 2, [s.error for s in streams]
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)


async def test_conflicting_operation_gets_409_and_a_short_deadline_504(http, agent, tiny_models, tmp_path):
    with Hold(tmp_path / "hold") as hold:
        long = held_stream(http, agent, PROMPT, 200, hold)
        await long.wait_for_tokens(2)
        pause = await _pausing(http, agent, "mode=wait")
        assert not pause.done(), "a held request cannot drain"
        status, body = await call(
            http,
            "POST",
            agent.admin_url + "/v1/agent/weights/disk",
            headers=agent.auth,
            body={"path": str(tiny_models["weights-2"]), "version": "B"},
        )
        assert status == 409 and body["error"]["code"] == "conflict"
        assert "pause" in body["error"]["message"]
    assert (await pause)[0] == 200
    await long.task
    assert long.finish_reason == "length", long.error
    assert (await state(http, agent))["weight_version"] == "A", "the refused update must not have run"
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)

    # A wait-mode pause that cannot drain in time answers 504 and says so in state.
    with Hold(tmp_path / "hold") as hold:
        long = held_stream(http, agent, PROMPT, 200, hold)
        await long.wait_for_tokens(2)
        status, body = await call(http, "POST", agent.admin_url + "/pause?mode=wait&timeout_s=0.05", headers=agent.auth)
        assert status == 504 and body["error"]["code"] == "deadline_exceeded"
        assert (await state(http, agent))["last_operations"][0]["status"] == "timeout"
    await long.task
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)

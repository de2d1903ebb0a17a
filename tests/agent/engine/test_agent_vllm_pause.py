"""The agent's pause modes on a real vLLM CPU engine (tiny Llama made at test time): a `keep`
request survives a disk update, `abort` ends what runs and nothing hangs, `wait` drains, and a
conflicting operation gets a 409 (a short deadline a 504). Those whose premise is timing are
marked `alone`.

The engine is the session's (`vllm_agent`, tests/conftest.py: start-up costs ~30 s), so each test
first puts it in the state it needs (`agent`, conftest.py) instead of assuming an order."""

from __future__ import annotations

import asyncio

import pytest

from rlcp.harness.http import call
from tests.agent.engine.vllm_support import ALONE, PROMPT, Stream, complete, state, tokenize

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


@ALONE
async def test_keep_mode_request_survives_disk_update(http, agent, tiny_models):
    prompt_ids = await tokenize(http, agent, PROMPT)
    total = 900  # long enough (~2 s on an idle machine) that the pause lands mid-request
    before = (await complete(http, agent, prompt_ids, total))["token_ids"]  # all on weights A

    for _attempt in range(3):
        stream = Stream(http, agent, prompt_ids, total)
        await stream.wait_for_tokens(5)
        status, _ = await call(http, "POST", agent.admin_url + "/pause?mode=keep", headers=agent.auth)
        assert status == 200
        seen_before_pause = len(stream.tokens)
        st = await state(http, agent)
        assert st["paused"] is True
        if st["requests"]["frozen"] == 1:
            break
        # The client saw the tokens late and the request finished before the pause: a
        # premise, not a result (a running request would be frozen, not finished).
        await asyncio.wait_for(stream.task, 10)
        assert stream.finish_reason == "length" and len(stream.tokens) == total
        await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
    else:
        pytest.fail("no request stayed running long enough to test against")
    frozen_at = await stream.settled()  # chunks generated before the pause may still be in flight
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

    assert stream.finish_reason == "length" and len(stream.tokens) == total
    # Before the pause: weights A. After the resume: exactly what weights B produce from
    # the same prefix (the request was recomputed, not continued on stale KV). The split is
    # where the stream leaves A's tokens: at or after what was generated before the pause
    # (B may happen to repeat A's next token; B's continuation from any later point is the same).
    split = next((i for i, (x, y) in enumerate(zip(stream.tokens, before)) if x != y), total)
    assert seen_before_pause <= frozen_at <= split < total, "the continuation must come from weights B"
    assert split <= frozen_at + 2  # B's first tokens may coincide with A's, rarely more than one
    after = (await complete(http, agent, prompt_ids + stream.tokens[:split], total - split))["token_ids"]
    assert stream.tokens[split:] == after


@ALONE
async def test_abort_mode_returns_abort_and_nothing_hangs(http, agent):
    for _attempt in range(3):
        streams = [Stream(http, agent, f"{PROMPT} {i}", 1000) for i in range(3)]
        for s in streams:
            await s.wait_for_tokens(3)
        status, body = await call(http, "POST", agent.admin_url + "/pause?mode=abort", headers=agent.auth)
        assert (status, body) == (200, {"status": "paused"})
        async with asyncio.timeout(20):  # none hangs
            await asyncio.gather(*(s.task for s in streams))
        # A stream the client saw late may have finished before the pause: that is a
        # premise, not a result. Every other one must come back aborted, with partial output.
        aborted = [s for s in streams if not (s.finish_reason == "length" and len(s.tokens) == 1000)]
        assert all(s.finish_reason == "abort" and 3 <= len(s.tokens) < 1000 for s in aborted)
        st = await state(http, agent)
        assert st["paused"] is True
        assert st["requests"] == {"running": 0, "waiting": 0, "frozen": 0}
        status, body = await call(http, "GET", agent.admin_url + "/is_paused")
        assert body == {"is_paused": True}
        await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
        if aborted:
            break
    else:
        pytest.fail("no request stayed running long enough to test against")
    assert len((await complete(http, agent, PROMPT, 8))["token_ids"]) == 8


@ALONE
async def test_wait_mode_drains(http, agent):
    # Tokens flowing proves the requests run (vLLM's wait mode drains running requests;
    # a queued one would stay queued until resume).
    streams = [Stream(http, agent, f"{PROMPT} {i}", 600) for i in range(2)]
    for s in streams:
        await s.wait_for_tokens(2)
    status, _ = await call(http, "POST", agent.admin_url + "/pause?mode=wait", headers=agent.auth)
    assert status == 200
    st = await state(http, agent)
    assert st["paused"] is True and st["requests"] == {"running": 0, "waiting": 0, "frozen": 0}
    async with asyncio.timeout(10):
        await asyncio.gather(*(s.task for s in streams))
    assert [(s.finish_reason, len(s.tokens)) for s in streams] == [("length", 600)] * 2
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)


async def _long_running_stream(http, agent) -> Stream:
    stream = Stream(http, agent, PROMPT, 1000)
    await stream.wait_for_tokens(2)
    return stream


@ALONE
async def test_conflicting_operation_gets_409_and_a_short_deadline_504(http, agent, tiny_models):
    # On a loaded machine the client may see a request's tokens late, after it already
    # finished; then there is nothing to drain and the premise does not hold: try again.
    for _attempt in range(3):
        long = await _long_running_stream(http, agent)
        pause = asyncio.create_task(call(http, "POST", agent.admin_url + "/pause?mode=wait", headers=agent.auth))
        while not pause.done() and (await state(http, agent))["busy_with"] != "pause":
            await asyncio.sleep(0.005)  # two connections have no order: wait until the agent runs the pause
        if pause.done():  # it had already finished: nothing left to drain
            await asyncio.wait_for(long.task, 10)
            assert long.finish_reason == "length"
            await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
            continue
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
        assert long.finish_reason == "length"
        break
    else:
        pytest.fail("no request stayed running long enough to test against")
    assert (await state(http, agent))["weight_version"] == "A", "the refused update must not have run"
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)

    # A wait-mode pause that cannot drain in time answers 504 and says so in state.
    for _attempt in range(3):
        long = await _long_running_stream(http, agent)
        status, body = await call(http, "POST", agent.admin_url + "/pause?mode=wait&timeout_s=0.05", headers=agent.auth)
        if status == 200:  # it had already finished: nothing left to drain
            await asyncio.wait_for(long.task, 10)
            assert long.finish_reason == "length"
            await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
            continue
        assert status == 504 and body["error"]["code"] == "deadline_exceeded"
        assert (await state(http, agent))["last_operations"][0]["status"] == "timeout"
        await long.task
        break
    else:
        pytest.fail("no request stayed running long enough to test against")
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)

"""The `sglang` flavor against SGLang 0.5.23's own server (`python -m sglang.launch_server`, its
own venv built by scripts/setup-sglang.sh; rlcp/harness/sglang.py), on the CPU, over the tiny Llama:
disk updates, pause modes with requests in flight, LoRA, sleep and wake, the cache flush. The
trainer's broadcast, a mixed fleet and the gateway: test_sglang_fleets.py.

Greedy outputs are exact functions of the weights, so "the server holds weights X" is checked
against the output of X loaded straight into the server through SGLang's own route before any
controller runs (`refs`). One server for the folder (conftest.py; start-up ~20 s idle, minutes on a
loaded machine); each test runs its own controller and leaves the server resumed on the base
weights, without adapters.
"""

from __future__ import annotations

import asyncio

import pytest

from rlcp.harness.controller import update_body
from rlcp.harness.http import call
from tests.controlplane.workers.flavors.sglang.support import (
    LONG_PROMPT,
    PROMPT,
    STREAM_TOKENS,
    Stream,
    by_worker,
    finish,
    generate,
    start_streams,
)

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]


# -- disk updates ------------------------------------------------------------------------------
async def test_a_verified_disk_update_changes_greedy_output_and_flushes_the_cache(http, server, ctl, refs, tiny_models):
    assert (await generate(http, server))[0] == refs[1]
    # Fills SGLang's radix cache with the old weights' KV: unflushed, the outputs below would mix.
    assert (await generate(http, server, LONG_PROMPT))[0] == refs["long", 1]
    for version, seed in (("step-2", 2), ("step-1", 1)):
        status, result = await ctl.call(
            "POST",
            "/v1/rl/update_weights",
            update_body(version, tiny_models[f"weights-{seed}"], pause_mode="keep", verify=True),
        )
        assert status == 200, result
        assert by_worker(result) == {"sglang-0": ("ok", "resume")}
        ids, meta = await generate(http, server)
        assert ids == refs[seed] and meta["weight_version"] == version
        assert (await generate(http, server, LONG_PROMPT))[0] == refs["long", seed]
        state = await ctl.state()
        assert state["applied"] == {"weight_version": version, "converged": True, "verified": True}
        worker = ctl.worker(state, "sglang-0")
        assert (worker["weight_version"], worker["serving"], worker["paused"]) == (version, True, False)
        # The name clients use survives SGLang renaming its model to the loaded directory.
        assert state["models"] == ["tiny"], state["models"]
        status, info = await call(http, "GET", server.url + "/model_info")
        assert info["weight_version"] == version  # SGLang's own read agrees


async def test_a_disk_update_that_cannot_load_leaves_the_version_and_fails_loudly(http, server, ctl, refs, tmp_path):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("step-x", empty, verify=True))
    assert status != 200 or any(r["status"] != "ok" for r in result["results"]), result
    status, info = await call(http, "GET", server.url + "/model_info")
    assert info["weight_version"] != "step-x"
    assert (await ctl.state())["applied"]["weight_version"] != "step-x"


# -- pause modes with requests in flight --------------------------------------------------------
async def test_pause_in_each_mode_with_requests_in_flight(http, server, ctl):
    # keep (SGLang's retract): nothing advances while paused; every request completes in full after.
    streams = await start_streams(http, server, "keep")
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    assert status == 200, result
    at_pause = [st.tokens for st in streams]
    # A token the scheduler computed before it paused can still be on its way (SGLang's detokenizer
    # process, then the HTTP stream): seen in CI, one more token per stream after the pause answered.
    await asyncio.sleep(0.5)
    frozen = [st.tokens for st in streams]
    assert all(t - p <= 2 and t < STREAM_TOKENS for t, p in zip(frozen, at_pause, strict=True)), (at_pause, frozen)
    await asyncio.sleep(1.0)  # the observation window of an absence (no token while paused), not a pace
    assert [st.tokens for st in streams] == frozen and not any(st.task.done() for st in streams)
    assert ctl.worker(await ctl.state(), "sglang-0")["paused"] is True
    status, result = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200, result
    await finish(streams)
    assert all(st.full for st in streams), [(st.status, st.finish, st.tokens) for st in streams]

    # abort: every request comes back 200, cut short, finish reason "abort".
    streams = await start_streams(http, server, "abort")
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
    assert status == 200, result
    await finish(streams, 60)
    assert all((st.status, st.finish) == (200, "abort") and st.tokens < STREAM_TOKENS for st in streams), [
        (st.status, st.finish, st.tokens) for st in streams
    ]
    status, result = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200, result

    # wait: the pause returns once the requests in flight drained, each in full.
    streams = await start_streams(http, server, "wait")
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "wait"})
    assert status == 200, result
    drained = [st.task.done() for st in streams]
    await finish(streams, 60)
    assert all(drained), "the wait-mode pause returned before the requests in flight finished"
    assert all(st.full for st in streams), [(st.status, st.finish, st.tokens) for st in streams]
    status, result = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200, result
    assert (await ctl.state())["pause_state"] == "running"


# -- LoRA ---------------------------------------------------------------------------------------
async def test_a_lora_load_serves_the_adapter_and_an_unload_removes_it(http, server, ctl, refs, tiny_models):
    status, result = await ctl.call(
        "POST", "/v1/rl/loras", {"name": "sql", "path": str(tiny_models["lora-11"]), "version": "a1"}
    )
    assert status == 200, result
    try:
        status, body = await call(
            http,
            "POST",
            server.url + "/generate",
            timeout_s=120,
            body={
                "text": PROMPT,
                "lora_path": "sql",
                "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
            },
        )
        assert status == 200, body
        assert body["output_ids"] != refs[1]  # the adapter changes the greedy output
        assert (await generate(http, server))[0] == refs[1]  # the base model's is unchanged
        status, models = await call(http, "GET", server.url + "/v1/models")
        assert "sql" in [c["id"] for c in models["data"]]
    finally:
        # Also when a check above failed: a desired adapter left behind puts the module's next
        # tests on a fleet that is not converged (CI25: the sleep test then read serving False).
        status, result = await ctl.call("DELETE", "/v1/rl/loras/sql")
    assert status == 200, result
    status, models = await call(http, "GET", server.url + "/v1/models")
    assert "sql" not in [c["id"] for c in models["data"]]


# -- sleep / wake (memory occupation) and the cache flush ------------------------------------------
async def test_sleep_keeps_the_server_out_and_a_wake_returns_it_unchanged(http, server, ctl, refs):
    """SGLang's `/release_memory_occupation` / `/resume_memory_occupation` on its CPU build free
    nothing (the weights stay where they are), so this proves the sequencing and the controller's
    view -- paused and out of service while asleep, the same greedy tokens after the wake -- not
    a memory release."""
    status, result = await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["sglang-0"], "level": 1})
    assert status == 200, result
    asleep = ctl.worker(await ctl.state(), "sglang-0")
    assert (asleep["sleeping"], asleep["serving"], asleep["paused"]) == (True, False, True), asleep
    status, result = await ctl.call("POST", "/v1/rl/wake_up", {})
    assert status == 200, result
    woken = ctl.worker(await ctl.state(), "sglang-0")
    assert (woken["sleeping"], woken["serving"], woken["paused"]) == (False, True, False), woken["not_ready_reason"]
    assert (await generate(http, server))[0] == refs[1]
    # The flush, through the guarded passthrough's driver call: with requests running it waits for
    # them (SGLang answers 400 without `timeout`), and the next answers are unchanged.
    stream = Stream(http, server.url, f"flush: {PROMPT}", 64)
    await ctl.ctl.registry.get("sglang-0").driver.reset_prefix_cache(running=True, external=False)
    await asyncio.wait_for(stream.task, 120)
    assert (stream.status, stream.finish) == (200, "length")
    assert (await generate(http, server))[0] == refs[1]

"""The `vllm` flavor against the real thing: two stock `vllm serve` processes, started as a
user starts them (dev mode, runtime LoRA updates, this project's CPU weight-transfer backend
named on the command line), driven by an in-process controller with flavor `vllm`: disk updates
and their round trips, sleep mode, pause modes with streams in flight, LoRA, a trainer's broadcast
through vLLM's RL routes. Failures: test_vllm_serve_failures.py.

Greedy completions are exact functions of the weights, so "every server holds weights X" is
checked against the outputs of X loaded straight into one server before any controller runs
(`refs`). The two servers are the folder's (conftest.py); each test runs its own controller and
leaves the servers on the base weights, resumed, without adapters.
"""

from __future__ import annotations

import asyncio

import pytest

from rlcp.harness import access_log
from rlcp.harness.controller import AUTH, CTL_TOKEN, update_body
from rlcp.harness.figures import record_figures
from rlcp.harness.hold import Hold
from rlcp.harness.http import call, free_port, settled
from rlcp.harness.trainer import run_trainer
from rlcp.harness.waiting import wait_for
from tests.controlplane.workers.flavors.vllm_serve.support import (
    LONG_PROMPT,
    PROMPT,
    STREAM_TOKENS,
    by_worker,
    complete,
    finish,
    paused,
    start_streams,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


# -- disk updates ------------------------------------------------------------------------------
async def test_a_disk_update_changes_every_servers_output_and_going_back_restores_it(
    http, servers, ctl, refs, tiny_models
):
    assert [await complete(http, s) for s in servers] == [refs[1], refs[1]]
    # Fills the prefix cache with blocks of the old weights; vLLM's reload keeps them, so these
    # outputs after each update show the driver's cache reset happened.
    assert [await complete(http, s, prompt=LONG_PROMPT) for s in servers] == [refs["long", 1]] * 2
    for version, seed in (("step-2", 2), ("step-1", 1)):
        status, result = await ctl.call(
            "POST",
            "/v1/rl/update_weights",
            update_body(version, tiny_models[f"weights-{seed}"], pause_mode="keep", verify=True),
        )
        assert status == 200, result
        assert by_worker(result) == {"vllm-0": ("ok", "resume"), "vllm-1": ("ok", "resume")}
        assert [await complete(http, s) for s in servers] == [refs[seed], refs[seed]]
        assert [await complete(http, s, prompt=LONG_PROMPT) for s in servers] == [refs["long", seed]] * 2
        state = await ctl.state()
        assert state["applied"] == {"weight_version": version, "converged": True, "verified": True}
        assert state["phase"] == "serving"
        assert [(w["weight_version"], w["ready"], w["serving"], w["paused"]) for w in state["workers"]] == [
            (version, True, True, False)
        ] * 2
    for s in servers:  # vLLM's own read agrees with the controller's view
        status, body = await call(http, "GET", s.url + "/weight_info")
        assert (status, body) == (200, {"weight_version": "step-1"})


async def test_an_update_and_an_adapter_load_take_few_round_trips_as_the_servers_log_them(
    http, servers, quiet_ctl, refs, tiny_models
):
    """Counted from the servers' side (the request log vLLM's `--middleware` hook writes), not from
    the controller's: a verified disk update is at most 6 requests in 4 sequential rounds per
    server; an adapter load at most 6 in 4 (issue 35)."""
    figures = {}

    async def counted(what: str, method: str, path: str, body: dict) -> None:
        request_id = f"{access_log.HOLD_PREFIX}{what.replace(' ', '-')}"  # carried to every call it causes
        status, result = await quiet_ctl.call(method, path, body, headers={**AUTH, "X-Request-ID": request_id})
        assert status == 200, result
        for s in servers:
            seen = access_log.read(s.log_path, request_id=request_id)
            routes = [e.route for e in sorted(seen, key=lambda e: e.start)]
            figures[f"{what} {s.name}"] = {"requests": len(seen), "rounds": access_log.rounds(seen), "routes": routes}
        for s in servers:
            assert len(seen := access_log.read(s.log_path, request_id=request_id)) <= 6, figures
            assert access_log.rounds(seen) <= 4, figures

    await counted(
        "disk update",
        "POST",
        "/v1/rl/update_weights",
        update_body("step-2", tiny_models["weights-2"], pause_mode="keep", verify=True),
    )
    assert [await complete(http, s) for s in servers] == [refs[2], refs[2]]
    state = await quiet_ctl.state()
    assert state["applied"] == {"weight_version": "step-2", "converged": True, "verified": True}
    assert [(w["weight_version"], w["paused"], w["serving"]) for w in state["workers"]] == [("step-2", False, True)] * 2
    record_figures("round_trips", "vllm", figures)
    await counted(
        "adapter load", "POST", "/v1/rl/loras", {"name": "ad", "path": str(tiny_models["lora-11"]), "version": "a1"}
    )
    state = await quiet_ctl.state()
    assert [w["loras"] for w in state["workers"]] == [{"ad": "a1"}] * 2
    assert await complete(http, servers[1], model="ad") != refs[2]
    status, result = await quiet_ctl.call("DELETE", "/v1/rl/loras/ad")
    assert status == 200, result
    record_figures("round_trips", "vllm", figures)


# -- sleep mode ---------------------------------------------------------------------------------
async def test_sleep_keeps_a_server_out_and_a_verified_wake_returns_it_unchanged(http, servers, ctl, refs):
    """vLLM's own dev routes (`/sleep`, `/wake_up`, `/is_sleeping`) on a stock server. Its CPU
    build accepts sleep and ignores the memory part (the scheduler pauses and resumes, the
    weights stay), so this proves the sequencing and the controller's view -- asleep and out of
    service, left alone by the reconciler, checked on wake (version and `/weight_checker`
    checksums against those taken before the sleep), the same greedy tokens after -- not a
    memory release."""
    before = await complete(http, servers[1])
    status, result = await ctl.call("POST", "/v1/rl/sleep", {"worker_ids": ["vllm-1"], "level": 1})
    assert status == 200, result
    assert by_worker(result) == {"vllm-1": ("ok", "sleep")}
    status, body = await call(http, "GET", servers[1].url + "/is_sleeping")
    assert (status, body) == (200, {"is_sleeping": True})
    state = await ctl.state()
    asleep, awake = (ctl.worker(state, w) for w in ("vllm-1", "vllm-0"))
    assert (asleep["sleeping"], asleep["cordoned"], asleep["serving"]) == (True, True, False)
    assert (awake["sleeping"], awake["serving"]) == (False, True)
    assert state["desired"]["asleep"]["vllm-1"]["checksums_digest"]
    record = ctl.ctl.registry.get("vllm-1")
    assert record is not None and ctl.ctl.reconciler.plan_for(record) == []  # nothing to converge or resume

    status, result = await ctl.call("POST", "/v1/rl/wake_up", {})
    assert status == 200, result
    assert by_worker(result) == {"vllm-1": ("ok", "resume")}
    status, body = await call(http, "GET", servers[1].url + "/is_sleeping")
    assert (status, body) == (200, {"is_sleeping": False})
    woken = ctl.worker(await ctl.state(), "vllm-1")
    assert (woken["sleeping"], woken["serving"], woken["paused"]) == (False, True, False)
    assert await complete(http, servers[1]) == before


# -- pause modes with streams in flight --------------------------------------------------------
async def test_pause_keep_loses_nothing_abort_aborts_every_request_and_wait_drains(http, servers, ctl, tmp_path):
    # keep: frozen while paused, every request completes in full after the resume. The streams
    # are held until the pause has landed (support.start_streams), so every one is in flight.
    with Hold(tmp_path / "keep") as hold:
        streams = await start_streams(http, servers, "keep", hold)
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
        assert status == 200, result
    frozen = await settled(streams)  # chunks sent before the pause may still be on the way
    # The behaviour under test is an absence (no token arrives while paused): it can only be
    # watched for a while, so this sleep is the observation window, not a pace.
    await asyncio.sleep(1.0)
    assert [len(st.tokens) for st in streams] == frozen and not any(st.task.done() for st in streams)
    assert all(n < STREAM_TOKENS for n in frozen)
    state = await ctl.state()
    assert state["pause_state"] == "paused" and [w["paused"] for w in state["workers"]] == [True, True]
    status, result = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200, result
    await finish(streams)
    assert all(st.full for st in streams), [(st.error, st.finish_reason, len(st.tokens)) for st in streams]

    # abort: every request comes back, cut short, with finish_reason "abort"; none errors or hangs.
    with Hold(tmp_path / "abort") as hold:
        streams = await start_streams(http, servers, "abort", hold)
        status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
        assert status == 200, result
    await finish(streams, 30)
    assert all((st.error, st.finish_reason) == (None, "abort") for st in streams), [
        (st.error, st.finish_reason) for st in streams
    ]
    assert all(len(st.tokens) < STREAM_TOKENS for st in streams)
    status, result = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200, result

    # wait: the pause returns once the requests in flight have drained, every one in full. Held
    # until both servers have taken the pause (vLLM says paused while a wait-mode pause drains).
    with Hold(tmp_path / "wait") as hold:
        streams = await start_streams(http, servers, "wait", hold)
        pause = asyncio.create_task(ctl.call("POST", "/v1/rl/pause", {"mode": "wait"}))
        await wait_for(lambda: paused(http, servers), timeout_s=60, what="both servers pausing", watching=servers)
        assert not pause.done() and not any(st.task.done() for st in streams), "the pause must wait for them"
    status, result = await pause
    assert status == 200, result
    drained = [st.task.done() for st in streams]
    await finish(streams, 30)
    assert all(st.full for st in streams), [(st.error, st.finish_reason, len(st.tokens)) for st in streams]
    assert all(drained), "the wait-mode pause returned before the requests in flight finished"
    status, result = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200, result
    assert (await ctl.state())["pause_state"] == "running"


# -- LoRA ------------------------------------------------------------------------------------------
async def test_lora_load_hot_swap_under_the_same_name_and_unload(http, servers, ctl, tiny_models):
    status, result = await ctl.call(
        "POST", "/v1/rl/loras", {"name": "ad", "path": str(tiny_models["lora-11"]), "version": "a1"}
    )
    assert status == 200, result
    first = [await complete(http, s, model="ad", prompt=LONG_PROMPT) for s in servers]
    base = await complete(http, servers[0], prompt=LONG_PROMPT)
    assert first[0] == first[1] != base
    state = await ctl.state()
    assert [w["loras"] for w in state["workers"]] == [{"ad": "a1"}] * 2
    assert [w["ready"] for w in state["workers"]] == [True, True]

    # Same name, new weights: the long prompt's cached blocks were computed with lora-11.
    status, result = await ctl.call(
        "POST", "/v1/rl/loras", {"name": "ad", "path": str(tiny_models["lora-12"]), "version": "a2"}
    )
    assert status == 200, result
    swapped = [await complete(http, s, model="ad", prompt=LONG_PROMPT) for s in servers]
    assert swapped[0] == swapped[1] != first[0]
    # The same adapter loaded fresh under a name never used before gives the same tokens. Through
    # the controller: one loaded straight into a server is not in the desired state, and the
    # reconciler would unload it under the test's feet.
    status, result = await ctl.call("POST", "/v1/rl/loras", {"name": "fresh", "path": str(tiny_models["lora-12"])})
    assert status == 200, result
    assert await complete(http, servers[1], model="fresh", prompt=LONG_PROMPT) == swapped[1]
    status, result = await ctl.call("DELETE", "/v1/rl/loras/fresh")
    assert status == 200, result

    status, result = await ctl.call("DELETE", "/v1/rl/loras/ad")
    assert status == 200, result
    for s in servers:
        status, body = await call(
            http, "POST", s.url + "/v1/completions", body={"model": "ad", "prompt": PROMPT, "max_tokens": 4}
        )
        assert status == 404, body
    state = await ctl.state()
    assert [w["loras"] for w in state["workers"]] == [{}, {}] and state["phase"] == "serving"


# -- broadcast through vLLM's RL routes --------------------------------------------------------------
# The trainer of test_broadcast_vllm (rlcp/harness/trainer.py): transformers' Llama broadcast as rank 0 by
# vLLM's own trainer-side engine on our gloo backend, its client pointed at the controller.
async def test_a_trainer_broadcasts_through_vllms_rl_routes_on_stock_servers(
    http, servers, ctl, refs, tiny_models, tmp_path
):
    status, body = await ctl.call("GET", "/v1/rl/weight_transfer")
    assert status == 200 and body["trainer_world_size"] == 3, body
    spec = {
        "client": "controller",
        "url": ctl.url,
        "token": CTL_TOKEN,
        "model_dir": str(tiny_models["weights-2"]),
        "port": free_port(),
        "version": "bcast-2",
    }
    assert [await complete(http, s, prompt=LONG_PROMPT) for s in servers] == [refs["long", 1]] * 2  # cached
    await run_trainer(spec, tmp_path / "trainer.log")

    assert [await complete(http, s) for s in servers] == [refs[2], refs[2]]
    assert [await complete(http, s, prompt=LONG_PROMPT) for s in servers] == [refs["long", 2]] * 2
    state = await ctl.state()
    assert state["applied"] == {"weight_version": "bcast-2", "converged": True, "verified": True}
    assert [(w["weight_version"], w["serving"]) for w in state["workers"]] == [("bcast-2", True)] * 2
    last = state["last_operation"]
    assert (last["kind"], last["status"]) == ("weight_transfer_update", "ok")
    # The outputs above are the proof that the plugin's `gloo` backend ran inside the stock
    # servers' worker processes: vLLM has no other CPU backend that could have moved them.


# -- a failed update leaves no worker silently paused -----------------------------------------------

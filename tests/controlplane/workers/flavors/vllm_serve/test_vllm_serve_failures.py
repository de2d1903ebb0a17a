"""The `vllm` flavor's failures on stock `vllm serve` (the folder's two servers, conftest.py): a
failed update names the workers it left paused and the reconciler backs off; a server killed in
the middle of an update is named, kept out and converged after its restart (last of the package:
it restarts a server).
"""

from __future__ import annotations

import asyncio

import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import update_body
from rlcp.harness.http import call
from rlcp.harness.waiting import wait_for
from tests.controlplane.workers.flavors.vllm_serve.support import (
    complete,
    reload_calls,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


async def test_a_failed_update_names_the_paused_workers_and_the_reconciler_backs_off(
    http, servers, ctl, refs, tiny_models, tmp_path
):
    bad = write_checkpoint(tiny_models["base"].parent / f"bad-{tmp_path.name}", seed=3)  # not this model's tensors
    calls_before = [reload_calls(s) for s in servers]
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("bad-3", bad, pause_mode="keep"))
    assert status == 502, result
    for r in result["results"]:
        assert (r["status"], r["phase"]) == ("error", "update"), r
        assert "no module or parameter named" in r["message"], r  # vLLM's own reason
    state = await ctl.state()
    assert state["phase"] in ("failed", "degraded"), state["phase"]
    for w in state["workers"]:  # paused, out of service, and the state says why
        assert (w["paused"], w["serving"], w["ready"]) == (True, False, False), w
        assert w["weight_version"] != "bad-3", w  # a failed reload names no version
        assert w["not_ready_reason"] and w["last_result"]["status"] == "error", w

    # The reconciler keeps trying, with growing backoff (0.5 s doubling to 4 s), never in a tight
    # loop: by the time the slower server has been retried twice, neither has been retried more
    # than a handful of times (its 0.2 s pass interval alone would retry every pass).
    def retries() -> list[int]:
        return [reload_calls(s) - before - 1 for s, before in zip(servers, calls_before)]

    await wait_for(lambda: min(retries()) >= 2, timeout_s=120, what="two retries of the failed reload on each server")
    assert all(n <= 6 for n in retries()), retries()

    # A good update brings the fleet back: vLLM's reload overwrites the half-loaded weights.
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("good-1", tiny_models["weights-1"]))
    assert status == 200, result
    assert [await complete(http, s) for s in servers] == [refs[1], refs[1]]
    state = await ctl.state()
    assert state["phase"] == "serving" and state["applied"]["converged"] is True


# -- a server killed in the middle of an update (last: it restarts a server) -------------------------
async def test_a_server_killed_mid_update_is_named_kept_out_and_converged_after_restart(
    http, servers, ctl, refs, tiny_models
):
    victim = servers[1]

    async def victim_paused() -> bool:
        status, body = await call(http, "GET", victim.url + "/is_paused", timeout_s=5)
        return status == 200 and body["is_paused"]

    update = asyncio.create_task(
        ctl.call("POST", "/v1/rl/update_weights", update_body("kill-2", tiny_models["weights-2"], pause_mode="keep"))
    )
    await wait_for(victim_paused, timeout_s=30, what="vllm-1 paused by the update", interval_s=0.01)
    victim.kill()
    status, result = await asyncio.wait_for(update, 120)
    assert status == 207, result
    results = {r["worker_id"]: r for r in result["results"]}
    assert (results["vllm-0"]["status"], results["vllm-0"]["phase"]) == ("ok", "resume")
    assert results["vllm-1"]["status"] in ("error", "timeout") and results["vllm-1"]["message"], results
    assert await complete(http, servers[0]) == refs[2]

    async def victim_down() -> dict | None:
        state = await ctl.state()
        w = ctl.worker(state, "vllm-1")
        return state if not w["reachable"] else None

    state = await wait_for(victim_down, timeout_s=30, what="vllm-1 seen unreachable")
    w = ctl.worker(state, "vllm-1")
    assert (w["ready"], w["serving"]) == (False, False)
    assert state["applied"]["converged"] is False

    # Back on the same port, on the base weights: converged before it counts as serving.
    victim.spawn()
    seen: list[tuple] = []

    async def victim_converged() -> bool:
        state = await ctl.state()
        w = ctl.worker(state, "vllm-1")
        seen.append((w["reachable"], w["weight_version"], w["serving"]))
        return w["serving"]

    await wait_for(victim_converged, timeout_s=240, what="vllm-1 serving again", interval_s=0.1)
    assert not [s for s in seen if s[2] and s[1] != "kill-2"], seen
    assert await complete(http, victim) == refs[2]
    state = await ctl.state()
    assert state["applied"]["weight_version"] == "kill-2" and state["applied"]["converged"] is True
    assert state["phase"] == "serving"

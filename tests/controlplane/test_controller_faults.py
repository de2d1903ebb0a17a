"""Controller faults with real processes: the controller (`python -m rlcp.controlplane`) and
SimEngine agents (`python -m rlcp.agent`) run as separate processes on loopback, and the tests
kill the controller from outside, as production kills it:

- the controller SIGKILLed in the middle of a transaction, twice, and restarted;
- the controller SIGKILLed while an operation hangs: restarted, it lists that one as interrupted.

Every test ends with the fleet converged by the reconciler, and checks from the agents' own
logs that no agent loaded a version twice. Timings of each recovery go to
bench/out/faults.json (see docs/reliability.md). `tests/controlplane/test_controller_sim.py` covers
the same faults on in-process agents, where the controller's internals can be inspected. The
fleet of processes: process_fleet.py and `make_fleet` (tests/controlplane/conftest.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlcp.harness.controller import rlctl
from rlcp.harness.figures import record_figures
from tests.controlplane.process_fleet import LOAD, all_busy, all_idle, phase_is, wait_until

pytestmark = pytest.mark.timeout(150)


# -- d. the controller SIGKILLed mid-transaction -------------------------------------------------------
async def test_controller_sigkilled_mid_transaction_recovers_and_loads_nothing_twice(make_fleet):
    fleet = await make_fleet(latency={"a0": 0.5, "a1": 0.5, "a2": 0.5})
    status, result = await fleet.update("v1", 1)
    assert status == 200, result
    figures: dict[str, Any] = {}
    # Round 1: killed while pausing (desired state saved, no agent loaded yet).
    # Round 2: killed while every agent is loading (they finish the load without it).
    for version, seed, moment in (("v2", 2, "pausing"), ("v3", 3, "loading")):
        update = asyncio.create_task(fleet.update(version, seed))
        # Every agent in the middle of the step (its engine call takes 0.5 s): the controller's
        # requests have all arrived, and it is killed before any answer comes back.
        busy = "pause" if moment == "pausing" else LOAD
        await wait_until(lambda: all_busy(fleet, busy), timeout_s=30, what=f"every agent busy with {busy}")
        # The state comes from the API front's replica, up to ~50 ms behind the core. (An agent
        # pauses inside the update's one call: the fleet's phase is "updating" throughout.)
        phase = "updating"
        await wait_until(lambda: phase_is(fleet, phase), timeout_s=5, what=f"the state to say {phase}")
        fleet.controller.kill()
        t_kill = time.monotonic()
        with pytest.raises(aiohttp.ClientError):  # the trainer's call dies with the controller
            await asyncio.wait_for(update, 30)
        # No controller: each agent still knows the desired version it was told, so none reports
        # ready on the old weights.
        await wait_until(lambda: all_idle(fleet), timeout_s=30, what="agents idle")
        for name in fleet.agents:
            a = await fleet.agent_state(name)
            # Each agent finishes the call it was in: loaded and resumed as that call said, or
            # paused; never serving the old weights.
            assert a["desired_weight_version"] == version, a
            assert a["paused"] is True or a["weight_version"] == version, a
            if a["weight_version"] != version:
                assert (await fleet.readyz(name))[0] == 503
        assert f'"weight_version": "{version}"' in Path(fleet.controller.config["store"]["path"]).read_text()

        t_restart = time.monotonic()
        await asyncio.to_thread(fleet.controller.start)
        st = await fleet.state()
        assert st["desired"]["weight_version"] == version, st["desired"]  # recovered from the file store
        assert st["desired"]["weight_source"]["path"] == str(fleet.ckpt[seed])
        await fleet.wait_converged(version, timeout_s=60)
        figures[f"killed_while_{moment}"] = {
            "restart_s": round(time.monotonic() - t_restart, 2),
            "kill_to_converged_s": round(time.monotonic() - t_kill, 2),
        }
    fleet.assert_each_version_loaded_once(["v1", "v2", "v3"])
    record_figures("faults", "controller_sigkill_mid_transaction", figures)


async def test_an_operation_the_controllers_death_interrupted_is_listed_interrupted_after_its_restart(make_fleet):
    """The operations log lived in the process: an update cut by a SIGKILL was recorded nowhere.
    Its record is kept with the desired state when it begins and when it ends, so the next
    start lists it as interrupted, with what it was doing; one that ended stays as it ended."""
    fleet = await make_fleet(proxied="a1")
    assert fleet.proxy is not None
    status, done = await fleet.update("v1", 1)
    assert status == 200 and done["status"] == "ok", done
    fleet.proxy.fault("POST", "/v1/agent/weights/update", "hang")  # a1 never answers the update's call
    update = asyncio.create_task(fleet.update("v2", 2))
    await wait_until(lambda: phase_is(fleet, "updating"), timeout_s=10, what="the update under way")
    await wait_until(
        lambda: bool(fleet.proxy and fleet.proxy.fired("POST", "/v1/agent/weights/update")),
        timeout_s=10,
        what="a1's update hanging",
    )
    running = (await fleet.state())["last_operation"]
    assert (running["kind"], running["status"], running["detail"]["version"]) == ("update_weights", "running", "v2")
    fleet.controller.kill()
    with pytest.raises(aiohttp.ClientError):
        await asyncio.wait_for(update, 30)
    fleet.proxy.clear()

    await asyncio.to_thread(fleet.controller.start)
    st = await fleet.state()
    last = st["last_operation"]
    assert (last["id"], last["kind"], last["status"]) == (running["id"], "update_weights", "interrupted"), last
    assert last["started_at"] == running["started_at"] and last["finished_at"] is None
    assert last["detail"]["version"] == "v2" and last["detail"]["path"] == str(fleet.ckpt[2])
    assert "began to lead" in last["detail"]["interrupted"], last["detail"]
    assert "operations" not in st["desired"] or st["desired"]["operations"] == []
    status, listing = await fleet.call("GET", "/v1/rl/operations")
    assert status == 200
    assert [(op["id"], op["status"]) for op in listing["operations"]] == [
        (running["id"], "interrupted"),
        (done["id"], "ok"),
    ], listing
    status, one = await fleet.call("GET", f"/v1/rl/operations/{running['id']}")
    assert status == 200 and one["status"] == "interrupted", one
    rc, out, err = await rlctl(fleet.controller.url, "ops")
    assert rc == 0, err
    assert running["id"] in out and "interrupted" in out and done["id"] in out, out
    assert "update_weights (version v2" in out, out  # what it was doing, under the table
    # The reconciler converges the fleet to v2 (desired before the pause began), as before.
    await fleet.wait_converged("v2", timeout_s=60)
    # A second restart finds it as the first left it.
    fleet.controller.stop()
    await asyncio.to_thread(fleet.controller.start)
    status, listing = await fleet.call("GET", "/v1/rl/operations")
    assert [(op["id"], op["status"]) for op in listing["operations"]][:2] == [
        (running["id"], "interrupted"),
        (done["id"], "ok"),
    ], listing

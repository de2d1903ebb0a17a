"""Faults with real processes: the controller (`python -m rlcp.controlplane`) and SimEngine agents
(`python -m rlcp.agent`) run as separate processes on loopback, and the tests break them from
outside, as production breaks them:

- an agent SIGKILLed in the middle of an update, then restarted on the same address;
- an agent frozen (SIGSTOP) past the update's deadline, then thawed;
- an agent answering 500 (a proxy in front of it), then recovering;
- the controller SIGKILLed in the middle of a transaction, twice, and restarted;
- the controller SIGKILLed while an operation hangs: restarted, it lists that one as interrupted;
- connections reset mid-response (after the headers, in the middle of the body) by a proxy.

Every test ends with the fleet converged by the reconciler, and checks from the agents' own
logs that no agent loaded a version twice. Timings of each recovery go to
bench/out/faults.json (see docs/reliability.md). `tests/controller/test_controller_sim.py` covers the
same faults on in-process agents, where the controller's internals can be inspected.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import AUTH as CTL_AUTH
from rlcp.harness.controller import controller_config, rlctl
from rlcp.harness.faults import FaultProxy
from rlcp.harness.figures import record_figures
from rlcp.harness.http import CONNECTION_ERRORS, call
from rlcp.harness.processes import AgentProcess, ControllerProcess, start_all
from rlcp.harness.simfleet import sim_agent_process as sim_agent
from rlcp.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(150)
LOAD = "update_weights_from_disk"
# Connection errors count as "not yet": the process polled may be restarting.
wait_until = functools.partial(wait_for, tolerate=CONNECTION_ERRORS)


def admin_port(agent: AgentProcess) -> int:
    return int(agent.config["admin"]["port"])


@dataclass
class Fleet:
    agents: dict[str, AgentProcess]
    controller: ControllerProcess
    proxy: FaultProxy | None
    ckpt: dict[int, Path]
    http: aiohttp.ClientSession

    async def call(self, method: str, path: str, body: Any = None, *, timeout_s: float = 90) -> tuple[int, Any]:
        async with self.http.request(
            method,
            self.controller.url + path,
            json=body,
            headers=CTL_AUTH,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            return resp.status, await resp.json()

    async def update(self, version: str, seed: int, **extra: Any) -> tuple[int, Any]:
        return await self.call(
            "POST",
            "/v1/rl/update_weights",
            {"version": version, "source": {"kind": "disk", "path": str(self.ckpt[seed])}, **extra},
        )

    async def state(self) -> dict:
        status, body = await call(self.http, "GET", self.controller.url + "/v1/rl/state", timeout_s=5)
        assert status == 200, body
        return body

    async def agent_state(self, name: str) -> dict:
        status, body = await call(self.http, "GET", self.agents[name].admin_url + "/v1/agent/state", timeout_s=5)
        assert status == 200, body
        return body

    async def readyz(self, name: str) -> tuple[int, Any]:
        return await call(self.http, "GET", self.agents[name].admin_url + "/readyz", timeout_s=5)

    async def busy_with(self, name: str, kind: str) -> bool:
        return (await self.agent_state(name))["busy_with"] == kind

    async def converged(self, version: str) -> dict | None:
        st = await self.state()
        ok = (
            st["desired"]["weight_version"] == version
            and st["applied"]["converged"]
            and st["applied"]["weight_version"] == version
            and st["phase"] == "serving"
            and all(w["serving"] for w in st["workers"])
        )
        return st if ok else None

    async def wait_converged(self, version: str, timeout_s: float = 60) -> dict:
        st = await wait_until(
            lambda: self.converged(version), timeout_s=timeout_s, what=f"fleet converged on {version}"
        )
        for name in self.agents:  # from the agents' side too: at the version, resumed, ready
            a = await wait_until(lambda n=name: self._idle_state(n), timeout_s=30, what=f"{name} idle")
            assert (a["weight_version"], a["paused"], a["ready"]) == (version, False, True), (name, a)
        return st

    async def _idle_state(self, name: str) -> dict | None:
        a = await self.agent_state(name)
        return a if a["busy_with"] is None else None

    def loads(self) -> dict[str, dict[str, int]]:
        return {name: dict(agent.disk_loads()) for name, agent in self.agents.items()}

    def assert_each_version_loaded_once(
        self, versions: list[str], *, interrupted: dict[str, str] | None = None
    ) -> None:
        """Every agent loaded every version exactly once, as its log says; `interrupted` names an
        agent whose load of a version was cut by its death (that one left no record)."""
        loads = self.loads()
        for name, counts in loads.items():
            assert counts == {v: 1 for v in versions}, f"{name} loaded {counts}; expected each of {versions} once" + (
                f" (interrupted: {interrupted})" if interrupted else ""
            )


def worker(state: dict, worker_id: str) -> dict:
    return next(w for w in state["workers"] if w["id"] == worker_id)


def by_worker(result: dict) -> dict[str, dict]:
    return {r["worker_id"]: r for r in result["results"]}


@pytest.fixture
async def make_fleet(tmp_path: Path, fresh_http: aiohttp.ClientSession):
    # A fresh connection per request: agents and the controller restart under these tests,
    # and a pooled connection to a dead process is not what is being tested.
    made: list[Fleet] = []

    async def make(*, latency: dict[str, float] | None = None, proxied: str | None = None) -> Fleet:
        latency = latency or {}
        ckpt = {seed: write_checkpoint(tmp_path / "weights" / f"seed-{seed}", seed) for seed in (1, 2, 3)}
        roots = [tmp_path / "weights"]
        agents = {
            name: sim_agent(name, tmp_path / "agents", roots, op_latency_s=latency.get(name, 0.05))
            for name in ("a0", "a1", "a2")
        }
        proxy = None
        if proxied is not None:
            proxy = await FaultProxy(admin_port(agents[proxied])).start()
        workers = [
            {
                "id": name,
                "flavor": "agent",
                "admin_url": proxy.url if proxy and name == proxied else f"http://127.0.0.1:{admin_port(a)}",
            }
            for name, a in agents.items()
        ]
        controller = ControllerProcess(
            controller_config(tmp_path / "controller", workers, roots), tmp_path / "controller"
        )
        fleet = Fleet(agents, controller, proxy, ckpt, fresh_http)
        made.append(fleet)
        # The proxy lives on this event loop: start the processes from a thread.
        await asyncio.to_thread(start_all, [*agents.values(), controller])
        await wait_until(lambda: _all_reachable(fleet), timeout_s=30, what="every worker reachable")
        return fleet

    yield make
    for fleet in made:
        for agent in fleet.agents.values():
            if agent.proc is not None and agent.proc.poll() is None:
                os.killpg(agent.proc.pid, signal.SIGCONT)  # a test that failed while one was stopped
        fleet.controller.stop()
        for agent in fleet.agents.values():
            agent.stop(timeout_s=10)
        if fleet.proxy is not None:
            await fleet.proxy.close()


async def _all_reachable(fleet: Fleet) -> bool:
    st = await fleet.state()
    return st["discovery_synced"] and all(w["reachable"] for w in st["workers"])


# -- a. an agent SIGKILLed mid-update -----------------------------------------------------------------
async def test_agent_sigkilled_mid_update_is_named_then_converged_before_ready(make_fleet):
    # a2's engine primitives take 1 s each, so its load (reload, name, drop cache) lasts ~3 s.
    fleet = await make_fleet(latency={"a2": 1.0})
    victim = fleet.agents["a2"]
    update = asyncio.create_task(fleet.update("v1", 1))
    await wait_until(lambda: fleet.busy_with("a2", LOAD), timeout_s=30, what="a2 loading v1")
    t_kill = time.monotonic()
    victim.kill()
    status, result = await asyncio.wait_for(update, 60)
    returned_after_kill = time.monotonic() - t_kill

    assert status == 207 and result["status"] == "partial", result
    res = by_worker(result)
    assert (res["a2"]["status"], res["a2"]["phase"]) == ("error", "update"), res["a2"]
    assert "/v1/agent/weights/update" in res["a2"]["message"], res["a2"]
    assert [(res[n]["status"], res[n]["phase"]) for n in ("a0", "a1")] == [("ok", "resume")] * 2, res
    for name in ("a0", "a1"):  # the others resumed on the new weights
        a = await fleet.agent_state(name)
        assert (a["weight_version"], a["paused"], a["ready"]) == ("v1", False, True), a
    st = await fleet.state()
    dead = worker(st, "a2")
    assert (dead["reachable"], dead["ready"], dead["serving"]) == (False, False, False), dead
    assert dead["last_error"] and dead["not_ready_reason"]
    assert st["phase"] == "degraded" and st["applied"]["converged"] is False
    assert by_worker(st["last_operation"])["a2"]["phase"] == "update"

    # Restart on the same address (base weights, a new instance id) and watch it from the moment
    # it answers until the controller reports it converged.
    samples: list[dict] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_restarted(fleet, "a2", samples, stop), name="watch-a2")
    t_restart = time.monotonic()
    await asyncio.to_thread(victim.start)
    t_started = time.monotonic()
    await fleet.wait_converged("v1", timeout_s=60)
    t_converged = time.monotonic()
    stop.set()
    await watcher

    reached = [s for s in samples if s["agent"] is not None]
    assert reached, "the restarted agent was never observed"
    stale = [s for s in reached if s["agent"]["weight_version"] != "v1"]
    assert stale, "no sample saw the restarted agent before it converged (the window this test is about)"
    for s in reached:
        # Versions only move from stale to v1 here, so a 200 followed by a stale state would
        # mean /readyz said ready while stale.
        if s["readyz"] == 200:
            assert s["agent"]["weight_version"] == "v1", s
        if s["agent"]["weight_version"] == "v1":  # named only once the load (cache drop included) is over
            assert s["agent"]["busy_with"] != LOAD, s
        if s["agent"]["weight_version"] != "v1":
            assert s["readyz"] == 503 and s["agent"]["ready"] is False, s
    for s in samples:  # the controller never lists it ready or serving while stale
        w = s["worker"]
        if w is not None and w["weight_version"] != "v1":
            assert not w["ready"] and not w["serving"], s
    assert any(s["worker"] and s["worker"]["reachable"] and s["worker"]["weight_version"] != "v1" for s in samples), (
        "the controller never saw the restarted agent stale (nothing to check against)"
    )
    # a2's first load of v1 died with it (no record); the reconciler's load is its only one.
    fleet.assert_each_version_loaded_once(["v1"], interrupted={"a2": "v1"})
    first_reach = min(s["t"] for s in reached)
    record_figures(
        "faults",
        "agent_sigkill_mid_update",
        {
            "call_returned_after_kill_s": round(returned_after_kill, 2),
            "restart_to_serving_agent_s": round(t_started - t_restart, 2),
            "reachable_to_converged_s": round(t_converged - first_reach, 2),
            "stale_samples_all_not_ready": len(stale),
            "engine_op_latency_s": 1.0,
        },
    )


async def _watch_restarted(fleet: Fleet, name: str, samples: list[dict], stop: asyncio.Event) -> None:
    """Sample the agent's state, its /readyz, its state again, and the controller's view of it."""
    while not stop.is_set():
        sample: dict[str, Any] = {"t": time.monotonic(), "agent": None, "readyz": None, "worker": None}
        try:
            _, before = await call(fleet.http, "GET", fleet.agents[name].admin_url + "/v1/agent/state", timeout_s=2)
            sample["readyz"], _ = await call(fleet.http, "GET", fleet.agents[name].admin_url + "/readyz", timeout_s=2)
            status, after = await call(fleet.http, "GET", fleet.agents[name].admin_url + "/v1/agent/state", timeout_s=2)
            sample["agent"] = after if status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            pass
        try:
            sample["worker"] = worker(await fleet.state(), name)
        except (aiohttp.ClientError, TimeoutError):
            pass
        samples.append(sample)
        await asyncio.sleep(0.03)


# -- b. an agent hanging past its deadline ---------------------------------------------------------------
async def test_agent_frozen_past_deadline_times_out_alone_then_converges(make_fleet):
    fleet = await make_fleet(latency={"a2": 1.0})
    victim = fleet.agents["a2"]
    t_call = time.monotonic()
    # timeout_s bounds each phase: the update's one call gets it for the pause and for the load,
    # as long again for the checksums its answer carries, and one 5 s grace (2+2+2+5,
    # `Deadlines.update_in_one_call`).
    update = asyncio.create_task(fleet.update("v1", 1, timeout_s=2))
    await wait_until(lambda: fleet.busy_with("a2", LOAD), timeout_s=30, what="a2 loading v1")
    t_stop = time.monotonic()
    os.killpg(victim.proc.pid, signal.SIGSTOP)  # the process stops answering; its sockets stay open
    try:
        status, result = await asyncio.wait_for(update, 60)
        returned_after_stop = time.monotonic() - t_stop
        assert status == 207, result
        res = by_worker(result)
        assert (res["a2"]["status"], res["a2"]["phase"]) == ("timeout", "update"), res["a2"]
        assert "within 11s" in res["a2"]["message"], res["a2"]
        assert res["a2"]["duration_s"] >= 11 - 0.5, res["a2"]  # it got its whole deadline, not less
        assert [(res[n]["status"], res[n]["phase"]) for n in ("a0", "a1")] == [("ok", "resume")] * 2, res
        for name in ("a0", "a1"):
            a = await fleet.agent_state(name)
            assert (a["weight_version"], a["paused"]) == ("v1", False), a
        st = await wait_until(lambda: _unreachable(fleet, "a2"), timeout_s=30, what="a2 reported unreachable")
        assert not worker(st, "a2")["ready"] and not worker(st, "a2")["serving"]
        # One hung worker must not hold up the others' status: while a2 hangs, a0 is still read
        # about every poll interval (0.2 s), not once per a2's status deadline (3 s).
        refreshes = await _last_seen_changes(fleet, "a0", window_s=4.0)
        assert refreshes >= 6, f"a0's status was refreshed only {refreshes} times in 4 s while a2 hung"
    finally:
        t_cont = time.monotonic()
        os.killpg(victim.proc.pid, signal.SIGCONT)
    await fleet.wait_converged("v1", timeout_s=60)
    t_converged = time.monotonic()
    # The load a2 was in when it froze finished after the thaw; the reconciler only resumed it.
    fleet.assert_each_version_loaded_once(["v1"])
    record_figures(
        "faults",
        "agent_frozen_past_deadline",
        {
            "phase_deadline_s": 9,
            "call_s": round(time.monotonic() - t_call, 2),
            "returned_after_freeze_s": round(returned_after_stop, 2),
            "thaw_to_converged_s": round(t_converged - t_cont, 2),
            "a0_status_refreshes_in_4s_during_hang": refreshes,
        },
    )


async def _last_seen_changes(fleet: Fleet, name: str, *, window_s: float) -> int:
    seen: set[str] = set()
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        seen.add(worker(await fleet.state(), name)["last_seen"])
        await asyncio.sleep(0.05)
    return len(seen) - 1


async def _unreachable(fleet: Fleet, name: str) -> dict | None:
    st = await fleet.state()
    return st if not worker(st, name)["reachable"] else None


# -- c. an agent answering 500, then recovering ----------------------------------------------------------
async def test_agent_answering_500_is_partial_then_converged(make_fleet):
    fleet = await make_fleet(proxied="a1")
    proxy = fleet.proxy
    assert proxy is not None
    proxy.fault("POST", "/v1/agent/weights/update", "status", status=500)  # the update's one call
    proxy.fault("POST", "/v1/agent/weights/disk", "status", status=500)  # the reconciler's load
    status, result = await fleet.update("v1", 1)
    assert status == 207 and result["status"] == "partial", result
    res = by_worker(result)
    assert (res["a1"]["status"], res["a1"]["phase"]) == ("error", "update"), res["a1"]
    assert "answered 500" in res["a1"]["message"], res["a1"]
    # Not retried: a retry after a lost answer could resume a worker the first attempt held back.
    assert len(proxy.fired("POST", "/v1/agent/weights/update")) == 1
    assert [(res[n]["status"], res[n]["phase"]) for n in ("a0", "a2")] == [("ok", "resume")] * 2, res
    a1 = await fleet.agent_state("a1")
    # The 500 came from the proxy: the agent was never reached, and serves its old weights -- out of
    # the fence (not at the desired version), and not ready once the reconciler tells it the version.
    assert (a1["weight_version"], a1["paused"]) == ("default", False), a1
    st = await fleet.state()
    assert st["phase"] == "degraded" and st["applied"]["weight_version"] is None
    w = worker(st, "a1")
    assert not w["serving"], w
    await wait_until(lambda: _not_ready(fleet, "a1"), timeout_s=30, what="a1 told the desired version")
    # The reconciler keeps trying (and keeps getting 500) with backoff...
    await wait_until(
        lambda: len(proxy.fired("POST", "/v1/agent/weights/disk")) > 3, timeout_s=30, what="the reconciler retrying a1"
    )
    # ...until the worker answers again.
    t_recover = time.monotonic()
    proxy.clear()
    await fleet.wait_converged("v1", timeout_s=60)
    t_converged = time.monotonic()
    fleet.assert_each_version_loaded_once(["v1"])  # the 500s never reached the agent
    record_figures(
        "faults",
        "agent_answering_500",
        {
            "recovered_to_converged_s": round(t_converged - t_recover, 2),
            "500s_answered_to_the_reconciler": len(proxy.fired("POST", "/v1/agent/weights/disk")),
        },
    )


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
        await wait_until(lambda: _all_busy(fleet, busy), timeout_s=30, what=f"every agent busy with {busy}")
        # The state comes from the API front's replica, up to ~50 ms behind the core. (An agent
        # pauses inside the update's one call: the fleet's phase is "updating" throughout.)
        phase = "updating"
        await wait_until(lambda: _phase_is(fleet, phase), timeout_s=5, what=f"the state to say {phase}")
        fleet.controller.kill()
        t_kill = time.monotonic()
        with pytest.raises(aiohttp.ClientError):  # the trainer's call dies with the controller
            await asyncio.wait_for(update, 30)
        # No controller: each agent still knows the desired version it was told, so none reports
        # ready on the old weights.
        await wait_until(lambda: _all_idle(fleet), timeout_s=30, what="agents idle")
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
    await wait_until(lambda: _phase_is(fleet, "updating"), timeout_s=10, what="the update under way")
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


async def _not_ready(fleet: Fleet, name: str) -> bool:
    return (await fleet.readyz(name))[0] == 503


async def _phase_is(fleet: Fleet, phase: str) -> bool:
    return (await fleet.state())["phase"] == phase


async def _all_busy(fleet: Fleet, kind: str) -> bool:
    return all([await fleet.busy_with(name, kind) for name in fleet.agents])


async def _all_idle(fleet: Fleet) -> bool:
    return all([(await fleet.agent_state(name))["busy_with"] is None for name in fleet.agents])


# -- e. connections reset mid-response ------------------------------------------------------------------
async def test_connection_reset_mid_response_is_reported_and_converged(make_fleet):
    fleet = await make_fleet(proxied="a1")
    proxy = fleet.proxy
    assert proxy is not None
    figures: dict[str, Any] = {}
    # The agent does the work; the controller gets the status line and headers (or half the body)
    # and then a reset. The answer must name the worker and the cut, promptly.
    for version, seed, route, cut, phase in (
        ("v1", 1, "/v1/agent/weights/update", "cut_after_headers", "update"),
        ("v2", 2, "/v1/agent/weights/update", "cut_mid_body", "update"),
    ):
        proxy.fault("POST", route, cut)
        t0 = time.monotonic()
        status, result = await fleet.update(version, seed, timeout_s=10)
        took = time.monotonic() - t0
        assert status == 207, result
        res = by_worker(result)
        assert (res["a1"]["status"], res["a1"]["phase"]) == ("error", phase), res["a1"]
        assert route in res["a1"]["message"], res["a1"]
        assert proxy.fired("POST", route), proxy.seen
        assert [(res[n]["status"], res[n]["phase"]) for n in ("a0", "a2")] == [("ok", "resume")] * 2, res
        # Not counted as serving on the strength of the cut call: only once read again, at the
        # version the agent itself reports (it did the work; a quick state poll may have read it
        # already, as on a loaded CI machine).
        a1 = worker(await fleet.state(), "a1")
        if a1["serving"]:
            assert a1["weight_version"] == version == (await fleet.agent_state("a1"))["weight_version"], a1
        t_fixed = time.monotonic()
        proxy.clear()
        await fleet.wait_converged(version, timeout_s=60)
        figures[cut] = {
            "route": route,
            "call_s": round(took, 2),
            "message": res["a1"]["message"],
            "fixed_to_converged_s": round(time.monotonic() - t_fixed, 2),
        }
    fleet.assert_each_version_loaded_once(["v1", "v2"])
    record_figures("faults", "connection_reset_mid_response", figures)

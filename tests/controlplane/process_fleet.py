"""The fleet of processes the fault tests break (test_agent_faults.py, test_controller_faults.py):
three SimEngine agents (`python -m rlcp.agent`) and the controller daemon on loopback, an optional
fault proxy in front of one agent, and the reads and waits the tests make on them. The fixture
that starts one, `make_fleet`, is in tests/controlplane/conftest.py."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from rlcp.harness.controller import AUTH as CTL_AUTH
from rlcp.harness.faults import FaultProxy
from rlcp.harness.http import CONNECTION_ERRORS, call
from rlcp.harness.processes import AgentProcess, ControllerProcess
from rlcp.harness.waiting import wait_for

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


async def all_reachable(fleet: Fleet) -> bool:
    st = await fleet.state()
    return st["discovery_synced"] and all(w["reachable"] for w in st["workers"])


async def unreachable(fleet: Fleet, name: str) -> dict | None:
    st = await fleet.state()
    return st if not worker(st, name)["reachable"] else None


async def not_ready(fleet: Fleet, name: str) -> bool:
    return (await fleet.readyz(name))[0] == 503


async def phase_is(fleet: Fleet, phase: str) -> bool:
    return (await fleet.state())["phase"] == phase


async def all_busy(fleet: Fleet, kind: str) -> bool:
    return all([await fleet.busy_with(name, kind) for name in fleet.agents])


async def all_idle(fleet: Fleet) -> bool:
    return all([(await fleet.agent_state(name))["busy_with"] is None for name in fleet.agents])

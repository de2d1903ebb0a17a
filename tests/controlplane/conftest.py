"""Fixtures of the control plane's tests beyond the suite's (tests/conftest.py):

- `fake` -> `FakeKubeApi`: the wire-level fake Kubernetes API server (tests/support/k8s_fake.py)
  that the discovery, leadership, persistence and k8s tests drive the real client against;
- `make_fleet` -> `make(*, latency, proxied) -> Fleet`: SimEngine agents and the controller daemon
  as processes on loopback (tests/controlplane/process_fleet.py), for the fault tests
  (test_agent_faults.py, test_controller_faults.py), stopped whatever the test left them in."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import controller_config
from rlcp.harness.faults import FaultProxy
from rlcp.harness.processes import ControllerProcess, start_all
from rlcp.harness.simfleet import sim_agent_process as sim_agent
from tests.controlplane.process_fleet import Fleet, admin_port, all_reachable, wait_until
from tests.support.k8s_fake import FakeKubeApi


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi(bookmark_interval_s=0.2) as api:
        yield api
        assert not api.unknown, f"the client asked for paths the fake does not serve: {api.unknown}"


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
        await wait_until(lambda: all_reachable(fleet), timeout_s=30, what="every worker reachable")
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

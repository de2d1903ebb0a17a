"""The servers the API fuzzing runs against, live on 127.0.0.1, each from an event loop in a
background thread (schemathesis' client is synchronous): the controller over a fleet of two real
agents on SimEngine (`rlcp/harness/simfleet.py`), one real agent on SimEngine, and the inference
gateway over two SimEngine agents' OpenAI ports. One of each per test process (package scope),
shared by the runs with and without the token, as when they were one module. Each offers `url` and
what a case may not change when it is refused: `touched()` (calls a worker or the engine received)
or `routed()` (requests the gateway forwarded).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import CTL_TOKEN, controller_settings
from rlcp.harness.live import LiveLoop, serve
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.fuzz.api.fuzzing import make_roots


@pytest.fixture(scope="package")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One allowed root for every server, with a real checkpoint, an adapter and a symlink out."""
    return make_roots(tmp_path_factory.mktemp("fuzz"))


class _FleetStack:
    """A served app over SimAgents, on a loop of its own; `close` stops both."""

    live: LiveLoop
    runner: web.AppRunner
    agents: list[SimAgent]

    def close(self) -> None:
        self.live.run(self.runner.cleanup())
        for a in self.agents:
            self.live.run(a.stop())
        self.live.close()


# -- the controller over a SimEngine fleet ----------------------------------------------------------
class ControllerStack(_FleetStack):
    async def _start_agents(self, engine: dict[str, Any]) -> list[SimAgent]:
        root = self.paths["root"]
        starting = (SimAgent(f"w{i}", [root], settings_overrides={"engine": engine}).start() for i in range(2))
        return list(await asyncio.gather(*starting))

    def __init__(self, base: Path, paths: dict[str, Path]) -> None:
        self.live = LiveLoop()
        self.paths = paths
        # Room for every adapter name the fuzzing loads: with an engine's usual few (max_loras 4) the
        # first loads fill it, and every later load is rightly refused before any call (409), so
        # `POST /load_lora_adapter` never reached past that check.
        engine = {"kind": "sim", "model": "sim", "max_loras": 4096}
        self.agents: list[SimAgent] = self.live.run(self._start_agents(engine))
        settings = controller_settings(
            base,
            [a.spec() for a in self.agents],
            allowed_roots=[str(self.paths["root"])],
            reconcile={"poll_interval_s": 0.2, "interval_s": 0.1},
            weight_transfer={"init_timeout_s": 2, "chunk_timeout_s": 2, "idle_timeout_s": 3600},
        )
        app = assemble(settings, token=CTL_TOKEN)
        self.runner, self.url = self.live.run(serve(app))
        self.live.run(self._settle(app[CONTROLLER]))

    @staticmethod
    async def _settle(ctl: Any) -> None:
        """Let the reconciler converge the fresh fleet, then stop it: a worker it called while a
        case runs would look touched by that case. The poller stays; it only reads."""
        await wait_for(
            lambda: (
                ctl.registry.membership.synced
                and all(r.reachable for r in ctl.members())
                and not any(ctl.reconciler.needs_work(r) for r in ctl.members())
            ),
            what="fleet settled",
        )
        for task in asyncio.all_tasks():
            if task.get_name() == "reconciler":
                task.cancel()

    def touched(self) -> list[int]:
        return [len(a.touched) for a in self.agents]


@pytest.fixture(scope="package")
def controller(tmp_path_factory: pytest.TempPathFactory, roots: dict[str, Path]) -> Iterator[ControllerStack]:
    stack = ControllerStack(tmp_path_factory.mktemp("fuzz-controller"), roots)
    yield stack
    stack.close()


# -- one agent on SimEngine ---------------------------------------------------------------------------
class AgentStack:
    def __init__(self, paths: dict[str, Path]) -> None:
        self.live = LiveLoop()
        self.paths = paths
        self.agent: SimAgent = self.live.run(SimAgent("fuzz-agent", [self.paths["root"]]).start())
        self.url = self.agent.url
        self.engine_calls: list[str] = []
        engine, enter = self.agent.engine, self.agent.engine._enter

        async def counted(op: str, **kw: Any) -> None:
            self.engine_calls.append(op)
            await enter(op, **kw)

        engine._enter = counted  # type: ignore[method-assign]

    def touched(self) -> int:
        return len(self.engine_calls)

    def close(self) -> None:
        self.live.run(self.agent.stop())
        self.live.close()


@pytest.fixture(scope="package")
def agent(roots: dict[str, Path]) -> Iterator[AgentStack]:
    stack = AgentStack(roots)
    yield stack
    stack.close()


# -- the inference gateway over a SimEngine fleet (their OpenAI ports) ---------------------------------
class GatewayStack(_FleetStack):
    def __init__(self, base: Path, paths: dict[str, Path]) -> None:
        self.live = LiveLoop()
        self.agents: list[SimAgent] = [
            self.live.run(SimAgent(f"g{i}", [paths["root"]], serve_inference=True).start()) for i in range(2)
        ]
        settings = controller_settings(
            base,
            [a.spec() for a in self.agents],
            allowed_roots=[str(paths["root"])],
            gateway={"port": 0, "hold_timeout_s": 2},
        )
        app = assemble(settings, token=CTL_TOKEN)
        self.runner, _ = self.live.run(serve(app))
        self.gateway = app[GATEWAY]
        self.live.run(
            wait_for(
                lambda: bool(self.gateway.router.table() and len(self.gateway.router.table().routes) == 2),
                what="both workers inside the fence",
            )
        )
        assert self.gateway.url is not None
        self.url = self.gateway.url

    def routed(self) -> int:
        return sum(self.gateway.routed.values())


@pytest.fixture(scope="package")
def gateway(tmp_path_factory: pytest.TempPathFactory, roots: dict[str, Path]) -> Iterator[GatewayStack]:
    stack = GatewayStack(tmp_path_factory.mktemp("fuzz-gateway"), roots)
    yield stack
    stack.close()

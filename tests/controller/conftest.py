"""The fleets the controller tests run against: one fixture a shape, each named for what it is.

- `memory_fleet` -> `MemoryFleet`: `memory_fleet_size` agents in this process, no sockets
  (`rlcp.harness.memory`); a test builds its controller with `memory_fleet.controller(tmp_path)`.
- `sim_fleet` -> `SimFleet(ctl, agents)`: SimEngine agents on loopback and an in-process
  controller over them (aiohttp's test client), every worker reachable.
- `gateway_fleet` -> `GatewayFleet(agents, ctl, gateway, http)`: the same with each agent's
  OpenAI port too, once every worker is inside the gateway's fence, and a client session.
- `daemon_fleet` -> `DaemonFleet(agents, ctl, http)`: SimEngine agents on loopback and the
  controller daemon as a process (front and core), every worker reachable, and a session
  opening a connection per request.
- `fresh_http` -> `aiohttp.ClientSession`: a client session opening a connection per request
  (processes restart, or close a connection after refusing a body).
- `checkpoints` -> `{seed: path}`: the weights of seeds 1, 2 and 3 on disk under the test's
  `tmp_path`.

A module that needs another size overrides `memory_fleet_size`; another shape of the socket
fleets, `fleet_shape` (a `FleetShape`). Shapes used by one module alone stay there, named for
themselves (`broadcast_fleet`, `adversarial_fleet`, `make_fleet`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from rlcp.controlplane.assembly import GATEWAY
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import controller_config, start_controller, wait_reachable
from rlcp.harness.memory import MemoryFleet
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.controller.fleets import DaemonFleet, FleetShape, GatewayFleet, SimFleet


@pytest.fixture
def memory_fleet_size() -> int:
    return 3


@pytest.fixture
async def memory_fleet(memory_fleet_size: int, tmp_path: Path) -> AsyncIterator[MemoryFleet]:
    fleet = await MemoryFleet.start(memory_fleet_size, roots=[tmp_path])
    yield fleet
    await fleet.stop()


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape()


async def _start_agents(shape: FleetShape, root: Path, *, inference: bool = False) -> list[SimAgent]:
    return list(
        await asyncio.gather(
            *(
                SimAgent(
                    f"w{i}", [root], serve_inference=inference or shape.inference, engine_kwargs=dict(shape.engine)
                ).start()
                for i in range(shape.agents)
            )
        )
    )


async def _stop_agents(agents: list[SimAgent]) -> None:
    for a in agents:
        await a.stop()


@pytest.fixture
async def sim_fleet(fleet_shape: FleetShape, tmp_path: Path) -> AsyncIterator[SimFleet]:
    agents = await _start_agents(fleet_shape, tmp_path)
    ctl = await start_controller(tmp_path, agents, **fleet_shape.settings)
    yield SimFleet(ctl, agents)
    await ctl.client.close()
    await _stop_agents(agents)


@pytest.fixture
async def gateway_fleet(fleet_shape: FleetShape, tmp_path: Path) -> AsyncIterator[GatewayFleet]:
    agents = await _start_agents(fleet_shape, tmp_path, inference=True)
    ctl = await start_controller(tmp_path, agents, **fleet_shape.settings)
    gateway = ctl.client.server.app[GATEWAY]

    def every_worker_in_the_fence() -> bool:
        table = gateway.router.table()
        return table is not None and len(table.routes) == len(agents)

    await wait_for(every_worker_in_the_fence, what="every worker inside the fence")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        yield GatewayFleet(agents, ctl, gateway, http)
    await ctl.client.close()
    await _stop_agents(agents)


@pytest.fixture
async def fresh_http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        yield session


@pytest.fixture
async def daemon_fleet(
    fleet_shape: FleetShape, tmp_path: Path, fresh_http: aiohttp.ClientSession
) -> AsyncIterator[DaemonFleet]:
    agents = await _start_agents(fleet_shape, tmp_path)
    config = controller_config(tmp_path, [a.spec() for a in agents], [tmp_path], **fleet_shape.settings)
    ctl = ControllerProcess(config, tmp_path)
    try:
        await ctl.spawn().wait_ready_async()
        await wait_reachable(fresh_http, ctl.url, workers=len(agents), timeout_s=30)
        yield DaemonFleet(agents, ctl, fresh_http)
    finally:
        ctl.stop()
        await _stop_agents(agents)


@pytest.fixture
def checkpoints(tmp_path: Path) -> dict[int, Path]:
    return {seed: write_checkpoint(tmp_path / f"ckpt-{seed}", seed) for seed in (1, 2, 3)}

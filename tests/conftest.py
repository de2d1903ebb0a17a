"""Fixtures more than one folder uses: the tiny models, the real vLLM agents (one engine each,
shared by the session: start-up costs ~30 s, so they are defined once, here, and not per folder),
the session's Dynamo fleet (its frontend and two workers, for the two Dynamo modules),
a module's reference outputs, an HTTP session, and the fleets of SimEngine agents the controller,
gateway, client and operation tests run against (below). What one folder's files share is in that
folder's conftest.py. The helpers behind them live in the `harness` package, which the
benchmarks and the local demo use too, and in tests/support (the fleets' shapes, the fake
Kubernetes API server).

The fleets, one fixture a shape, each named for what it is:
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
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from rlcp.controlplane.assembly import GATEWAY
from rlcp.harness import hold
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import controller_config, start_controller, wait_reachable
from rlcp.harness.leftovers import mark_owner, reap
from rlcp.harness.memory import MemoryFleet
from rlcp.harness.processes import AgentProcess, ControllerProcess
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.tiny_model import agent_engine
from rlcp.harness.waiting import wait_for
from tests.support.dynamo_fleet import DynamoFleet
from tests.support.fleets import DaemonFleet, FleetShape, GatewayFleet, SimFleet

# The API fuzzing's closing checks judge at the end of the run, over every worker's cases: their
# plugin must be in every pytest process, the xdist controller (which collects no test) included.
pytest_plugins = ("tests.fuzz.api.reach",)

# Every process a test starts, and every process those start, carries this process's mark
# (rlcp/harness/leftovers.py), so the run can tell at its end what it left behind.
_OWNER = mark_owner()

# Ray reads this once, when `ray._private.ray_constants` is first imported, so it is set here,
# before any test can import Ray: otherwise a driver in this process turns 127.0.0.1 into the
# machine's own address and never reaches the loopback heads the tests start. A fast-lane run
# (xdist's plain `--dist load`) ran test_placement_loop's check of Ray's constants before
# test_ray_discovery on one worker: its `ray.init` waited on 192.0.2.2 until the timeout.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind():
    """Fails the run if any process a test started (agent, controller, gateway, engine, Envoy,
    Ray, Dynamo, ...) is still alive once every fixture has stopped what it started: the first
    session fixture set up, so the last torn down. What is found is killed and named."""
    yield
    left = reap(_OWNER)
    if left:
        pytest.fail(
            f"{len(left)} process(es) started by this test process outlived the run (killed now):\n"
            + "\n".join(f"  pid {p.pid}: {p.command}" for p in left),
            pytrace=False,
        )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Make `xdist_group` group again (scripts/test.sh runs the rest part `-n 2 --dist loadgroup`).

    pytest-xdist (3.8) groups by renaming each marked item's `_nodeid` to `<nodeid>@<group>` in
    the worker; pytest 9 reads a node's id from `_id` instead, so the rename was lost and every
    `xdist_group` was a silent no-op: tests of one module ran on both workers, each setting up
    the module's fixtures (two Ray heads for one module, beside the other modules' heads). This
    does xdist's rename on `_id`, only where xdist's own did not take."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        groups = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        nodeid = item.nodeid
        if groups and not nodeid.endswith("@" + "_".join(groups)) and hasattr(item, "_id"):
            item._id = type(item._id).parse(f"{nodeid}@{'_'.join(groups)}")  # as xdist's, on pytest 9's field


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Llama (seed 1 = base weights), a second weight set (seed 2), two LoRAs."""
    from rlcp.harness.tiny_model import make_model_family

    return make_model_family(tmp_path_factory.mktemp("models"))


def vllm_agent_config(models: dict[str, Path]) -> dict:
    return {
        "agent_id": "vllm-0",
        "allowed_roots": [str(models["base"].parent)],
        "log_format": "json",
        # This project's CPU weight-transfer backend (rlcp/agent/weight_transfer), so the
        # broadcast path runs end to end on these engines; and the harness's hold
        # (rlcp/harness/hold.py), so a test can keep a request running until it lets it go.
        "engine": agent_engine(
            models["base"], extra_engine_args={"weight_transfer_config": {"backend": "gloo"}, **hold.ENGINE_ARG}
        ),
    }


def one_core(index: int) -> dict[str, str]:
    """The engine's CPU threads bound to one core of its own. vLLM's default ("auto") binds every
    engine's threads to the same cores: two engines on two cores then spin against each other, and
    one was seen to take no step for 36 to 95 s while the other decoded (a keep-mode pause never
    taken). The local fleet binds its agents the same way. It takes effect under vLLM's
    multiprocessing executor only (VLLM_ENABLE_V1_MULTIPROCESSING=1); by default the harness runs
    each engine on one OpenMP thread instead (`rlcp.harness.engine_env`)."""
    return {"VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1))}


def _session_uses(request: pytest.FixtureRequest, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
def _vllm_agent_b_process(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The second agent, not yet started (`vllm_agent` may spawn it, `vllm_agent_b` waits for it)."""
    config = vllm_agent_config(tiny_models) | {"agent_id": "vllm-1"}
    agent = AgentProcess(config, tmp_path_factory.mktemp("vllm-agent-b"), env=one_core(1))
    yield agent
    agent.stop()


@pytest.fixture(scope="session")
def vllm_agent(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """One real vLLM CPU agent shared by the session (engine start-up costs ~30 s). When the
    session will use the second agent too, both engines start together (a core each) while no
    test runs yet, instead of the second one starting later on its own (~30 s saved)."""
    agent = AgentProcess(vllm_agent_config(tiny_models), tmp_path_factory.mktemp("vllm-agent"), env=one_core(0)).spawn()
    try:
        if _session_uses(request, "vllm_agent_b"):
            request.getfixturevalue("_vllm_agent_b_process").spawn()
        agent.wait_ready()
    except BaseException:
        agent.stop()
        raise
    yield agent
    agent.stop()


@pytest.fixture(scope="session")
def vllm_agent_b(_vllm_agent_b_process: AgentProcess):
    """A second real vLLM CPU agent, for fleet tests through the controller."""
    if _vllm_agent_b_process.proc is None:
        _vllm_agent_b_process.spawn()
    return _vllm_agent_b_process.wait_ready()


@pytest.fixture(scope="session")
def dynamo_fleet(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    """Dynamo's own frontend and up to two of its vLLM workers, shared by the session's Dynamo
    modules (tests/support/dynamo_fleet.py): each module takes the workers it needs with
    `dynamo_fleet.use(n)`. Nothing starts until one does, and it stops after the run's last test
    that uses it (`pytest_runtest_teardown` below), not at the session's end: in the engine part
    the modules after the Dynamo ones run for minutes."""
    from rlcp.harness.dynamo import dynamo_target

    fleet = DynamoFleet(tiny_models, tmp_path_factory.mktemp("dynamo"), dynamo_target())
    pytestconfig.stash[_DYNAMO_FLEET] = fleet
    try:
        yield fleet
    finally:
        fleet.stop()


_DYNAMO_FLEET = pytest.StashKey[DynamoFleet]()
_LAST_DYNAMO_TEST = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [item.nodeid for item in session.items if "dynamo_fleet" in getattr(item, "fixturenames", ())]
    if users:
        session.config.stash[_LAST_DYNAMO_TEST] = users[-1]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After the last test that uses the session's Dynamo fleet (its module's fixtures torn down
    first), the fleet stops; a later `use` would start it again."""
    try:
        return (yield)
    finally:
        if item.nodeid == item.config.stash.get(_LAST_DYNAMO_TEST, None):
            fleet = item.config.stash.get(_DYNAMO_FLEET, None)
            if fleet is not None:
                fleet.stop()


@pytest.fixture(scope="module")
def references() -> dict:
    """Reference outputs a module's tests compute once (greedy tokens of each weight set) and
    share: empty at the module's first test."""
    return {}


@pytest.fixture
async def http():
    # Idle connections are dropped under the servers' own keep-alive (uvicorn, vLLM's and SGLang's
    # server, closes one after 5 s), as the gateway does (`upstream_idle_timeout_s`, 4 s). With
    # aiohttp's default 15 s a connection idle past 5 s can be reused just as the server closes
    # it: "Server disconnected", seen on a vLLM agent's first request after a 3 s wait.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=4.0)) as session:
        yield session


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

"""The gateway as a data plane over failing and busy workers: real agents on SimEngine inside a
real controller, faults injected on their OpenAI ports (`rlcp.harness.faults`).

- Outlier detection: a worker failing requests in a row (5xx answers, or resets before the
  first byte, which the client never sees) leaves the rotation for a backoff that grows with
  each ejection in a row, shown in the state document and in metrics; after the backoff one
  real request probes it, and its outcome closes the circuit or ejects it again. When every
  member is ejected, requests are held until a probe may go, within their hold deadline.
- Admission: with `gateway.max_in_flight_per_worker`, a request finding every member at its
  limit is held until a slot frees, or answered 503 with `Retry-After` at its hold deadline.
- TCP_NODELAY on both of the gateway's sides: the connections it accepts and the ones it opens.
- A worker whose port is closed (its agent stopped) refuses connections: it is down, not failing.
  It is ejected after one refusal, the refusal is not one of the request's `attempts`, and the
  request goes to another member or is held until one serves (the same agent started again) or
  its hold deadline passes (503, never 502). These run over a fence written by hand
  (`rlcp.harness.fleet_state`), so that no controller takes the stopped worker out of it first.

The circuits' clock is a manual one (the breaker's test seam), so a backoff is over when the
test says so, never by waiting.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from rlcp.controlplane.gateway.app import GATEWAY, new_session, start_site
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.harness.faults import Fault
from rlcp.harness.fleet_state import serving_fleet, serving_worker
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import FixedState, FleetShape, GatewayFleet, gateway_client

pytestmark = pytest.mark.timeout(120)
BODY = {"model": "sim", "prompt": "hi", "max_tokens": 2}
PATH = "/v1/completions"


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(
        settings={
            "gateway": {
                "port": 0,
                "outlier_failures": 2,
                "outlier_backoff_s": 10,
                "outlier_max_backoff_s": 40,
                "max_in_flight_per_worker": 1,
            }
        }
    )


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(gateway_fleet: GatewayFleet) -> ManualClock:
    clock = ManualClock()
    gateway_fleet.gateway.breakers.clock = clock
    return clock


async def post(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, dict[str, str], dict]:
    async with http.post(f"{url}{PATH}", json=BODY, **kw) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def gateway_section(fleet: GatewayFleet) -> dict[str, dict]:
    status, state = await fleet.ctl.call("GET", "/v1/rl/state")
    assert status == 200
    return {w["worker_id"]: w for w in state["gateway"]["workers"]}


async def metric(fleet: GatewayFleet, line_start: str) -> float:
    async with fleet.http.get(f"{fleet.gateway.url}/metrics") as resp:
        text = await resp.text()
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


async def test_a_worker_failing_in_a_row_is_ejected_probed_and_restored(
    gateway_fleet: GatewayFleet, clock: ManualClock
) -> None:
    agents, ctl, gateway, http = gateway_fleet
    w0 = agents[0]
    w0.inference_faults.add("POST", PATH, Fault("status", 500))
    # Requests alternate over the idle fleet: w0's two 500s (passed on unchanged) eject it.
    answers = [await post(http, gateway.url) for _ in range(4)]
    assert sorted((s, h["X-RL-Worker"]) for s, h, _ in answers) == [(200, "w1"), (200, "w1"), (500, "w0"), (500, "w0")]
    workers = await gateway_section(gateway_fleet)
    assert workers["w0"]["circuit"] == "open" and workers["w0"]["ejections"] == 1 and workers["w0"]["in_fence"]
    assert workers["w0"]["back_in_s"] == 10 and workers["w1"]["circuit"] == "closed"
    assert await metric(gateway_fleet, 'rlcp_gateway_worker_ejected{worker="w0"}') == 1
    assert await metric(gateway_fleet, 'rlcp_gateway_worker_ejections_total{worker="w0"}') == 1
    # Out of the rotation: every request goes to w1, w0 sees none of them.
    fired = len(w0.inference_faults.fired("POST", PATH))
    answers = [await post(http, gateway.url) for _ in range(4)]
    assert [(s, h["X-RL-Worker"]) for s, h, _ in answers] == [(200, "w1")] * 4
    assert len(w0.inference_faults.fired("POST", PATH)) == fired

    # Backoff over: half-open, one request probes w0; it fails, and w0 is out for twice as long.
    clock.now += 10
    assert {w.worker_id: w.circuit for w in gateway.view().workers}["w0"] == "half_open"
    seen = [await post(http, gateway.url) for _ in range(2)]
    assert sorted((s, h["X-RL-Worker"]) for s, h, _ in seen) == [(200, "w1"), (500, "w0")]
    workers = await gateway_section(gateway_fleet)
    assert workers["w0"]["circuit"] == "open" and workers["w0"]["ejections"] == 2 and workers["w0"]["back_in_s"] == 20

    # Healed: the next probe succeeds and w0 is back in the rotation.
    w0.inference_faults.clear()
    clock.now += 20
    seen = [await post(http, gateway.url) for _ in range(2)]
    assert sorted((s, h["X-RL-Worker"]) for s, h, _ in seen) == [(200, "w0"), (200, "w1")]
    workers = await gateway_section(gateway_fleet)
    assert workers["w0"]["circuit"] == "closed" and workers["w0"]["consecutive_failures"] == 0
    assert await metric(gateway_fleet, 'rlcp_gateway_worker_ejected{worker="w0"}') == 0
    answers = [await post(http, gateway.url) for _ in range(4)]
    assert sorted(h["X-RL-Worker"] for _, h, _ in answers) == ["w0", "w0", "w1", "w1"]


async def test_resets_before_the_first_byte_are_retried_and_eject_the_worker(
    gateway_fleet: GatewayFleet, clock: ManualClock
) -> None:
    agents, ctl, gateway, http = gateway_fleet
    agents[1].inference_faults.add("POST", PATH, Fault("reset"))
    answers = [await post(http, gateway.url) for _ in range(4)]
    # The client never sees w1's resets: each is tried again on w0.
    assert [(s, h["X-RL-Worker"]) for s, h, _ in answers] == [(200, "w0")] * 4
    assert len(agents[1].inference_faults.fired("POST", PATH)) == 2  # then ejected: no more tries there
    workers = await gateway_section(gateway_fleet)
    assert workers["w1"]["circuit"] == "open" and workers["w1"]["failed"] == 2


async def test_with_every_member_ejected_requests_are_held_until_a_probe_may_go(
    gateway_fleet: GatewayFleet, clock: ManualClock
) -> None:
    agents, ctl, gateway, http = gateway_fleet
    for a in agents:
        a.inference_faults.add("POST", PATH, Fault("status", 503))
    while gateway.breakers.ejected < 2:
        status, _, _ = await post(http, gateway.url)
        assert status == 503
    for a in agents:
        a.inference_faults.clear()
    # Past a short hold deadline: 503 with Retry-After, saying why.
    status, headers, answer = await post(http, gateway.url, headers={"X-RL-Hold-Timeout": "0.2"})
    assert status == 503 and headers["Retry-After"] and "X-RL-Worker" not in headers
    assert answer["error"]["code"] == "no_capacity" and "ejected" in answer["error"]["message"]
    # Within it: held, and out as soon as a backoff is over (the probe), then answered.
    held = asyncio.create_task(post(http, gateway.url))
    await wait_for(lambda: gateway.held == 1, what="the request held while every member is ejected")
    assert not held.done()
    clock.now += 10
    status, headers, _ = await asyncio.wait_for(held, 20)
    assert status == 200
    workers = await gateway_section(gateway_fleet)
    assert workers[headers["X-RL-Worker"]]["circuit"] == "closed"


async def test_a_request_finding_every_member_at_its_limit_is_held_then_sent(gateway_fleet: GatewayFleet) -> None:
    agents, ctl, gateway, http = gateway_fleet
    for a in agents:  # each worker's first request hangs: it holds the worker's one slot
        a.inference_faults.add("POST", PATH, Fault("hang", times=1))
    busy = [asyncio.create_task(post(http, gateway.url)) for _ in range(2)]
    await wait_for(lambda: gateway.in_flight["w0"] == gateway.in_flight["w1"] == 1, what="both workers at the limit")
    assert (await ctl.call("GET", "/v1/rl/state"))[1]["gateway"]["max_in_flight_per_worker"] == 1
    status, headers, answer = await post(http, gateway.url, headers={"X-RL-Hold-Timeout": "0.2"})
    assert status == 503 and headers["Retry-After"] and "X-RL-Worker" not in headers
    assert "max_in_flight_per_worker (1)" in answer["error"]["message"], answer
    waiting = asyncio.create_task(post(http, gateway.url))
    await wait_for(lambda: gateway.held == 1, what="a request held at the admission limit")
    assert sum(gateway.routed.values()) == 2  # it was sent nowhere
    # One of the hung requests' clients goes away: its slot frees, the held request goes there.
    busy[0].cancel()
    status, headers, _ = await asyncio.wait_for(waiting, 20)
    assert status == 200 and gateway.held == 0
    busy[1].cancel()
    await asyncio.gather(*busy, return_exceptions=True)
    await wait_for(lambda: sum(gateway.in_flight.values()) == 0, what="every slot free again")
    # Not failures: no circuit opened by a client going away.
    assert gateway.breakers.ejected == 0


def _nodelay(transport: Any) -> int:
    sock = transport.get_extra_info("socket")
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def test_tcp_nodelay_on_both_sides_of_the_gateway(gateway_fleet: GatewayFleet) -> None:
    agents, ctl, gateway, http = gateway_fleet
    # A site started as the controller starts its gateway's (`start_site`), over the same fleet.
    async with new_session() as session:
        own = Gateway(
            router=gateway.router, session=session, settings=GatewaySettings(port=0), metrics=GatewayMetrics()
        )
        runner = await start_site(own)
        try:
            status, _, _ = await post(http, own.url or "")
            assert status == 200
            # The connections it accepts: its site's live ones (this client's, kept alive).
            accepted = [h.transport for h in runner.server.connections if h.transport is not None]
            assert accepted and all(_nodelay(t) == 1 for t in accepted)
            # The connections it opens: its upstream pool's, to the worker that answered (kept
            # alive after the answer).
            opened = [t for a in agents for t in own.sender.upstream.idle(a.spec()["inference_url"])]
            assert opened and all(_nodelay(t) == 1 for t in opened)
        finally:
            await runner.cleanup()


# The controller reads its workers once at start and then not for a minute: the fence still
# holds w0 when its engine dies, so the gateway's own verdict is what keeps requests off it.
SLOW_READS = FleetShape(
    settings={
        "gateway": {"port": 0, "outlier_failures": 2, "outlier_backoff_s": 10},
        "reconcile": {"poll_interval_s": 60, "interval_s": 60, "backoff_initial_s": 1, "backoff_max_s": 1},
    }
)


@pytest.mark.parametrize("fleet_shape", [SLOW_READS])
async def test_a_dead_engine_is_ejected_at_once_and_what_it_refused_served_by_another(
    gateway_fleet: GatewayFleet, clock: ManualClock
) -> None:
    agents, ctl, gateway, http = gateway_fleet
    agents[0].engine.kill()  # the agent stays up and refuses at arrival: 503 `engine_dead`
    answers = [await post(http, gateway.url) for _ in range(4)]
    # Never reached an engine: answered by w1, the client sees no failure; and one refusal is
    # enough to eject w0 (outlier_failures is 2 here).
    assert [(s, h["X-RL-Worker"]) for s, h, _ in answers] == [(200, "w1")] * 4
    workers = await gateway_section(gateway_fleet)
    assert workers["w0"]["circuit"] == "open" and workers["w0"]["ejections"] == 1 and workers["w0"]["failed"] == 1


async def test_a_request_during_which_the_engine_died_is_not_sent_again(
    gateway_fleet: GatewayFleet, clock: ManualClock
) -> None:
    agents, ctl, gateway, http = gateway_fleet
    # Long enough to be in flight when its engine dies (the sim engine makes a token each 5 ms).
    slow = asyncio.create_task(http.post(f"{gateway.url}{PATH}", json=BODY | {"max_tokens": 2000}))
    # In its engine, not only counted out by the gateway (which counts it before it is sent): a
    # kill before it arrives is answered `engine_dead` and it goes to the other worker, rightly.
    busy = await wait_for(
        lambda: next((a.agent_id for a in agents if a.engine.request_counts().running), None),
        what="a request running in an engine",
    )
    victim, other = (agents[0], agents[1]) if busy == "w0" else (agents[1], agents[0])
    routed_to_other = gateway.routed[other.agent_id]
    victim.engine.kill()
    async with await slow as resp:
        status, answer = resp.status, await resp.json()
    # A clear 502 naming the worker; the request may be what killed the engine, so no other
    # worker gets it; and the worker is out of the rotation at once.
    assert status == 502 and answer["error"]["code"] == "engine_died", answer
    assert f"worker {victim.agent_id}'s engine died while serving this request" in answer["error"]["message"]
    assert gateway.routed[other.agent_id] == routed_to_other
    workers = await gateway_section(gateway_fleet)
    assert workers[victim.agent_id]["circuit"] == "open" and workers[victim.agent_id]["ejections"] == 1
    answers = [await post(http, gateway.url) for _ in range(3)]
    assert [(s, h["X-RL-Worker"]) for s, h, _ in answers] == [(200, other.agent_id)] * 3


# -- workers refusing connections (a fence written by hand: no controller notices them down) ------


@pytest.fixture
async def sim_agents(tmp_path: Any) -> AsyncIterator[list[SimAgent]]:
    """Two agents serving the fence's weights `v1` on their OpenAI ports; a test stops or starts them."""
    agents = [
        SimAgent(f"w{i}", [tmp_path], serve_inference=True, engine_kwargs={"initial_weight_version": "v1"})
        for i in range(2)
    ]
    for a in agents:
        await a.start()
    yield agents
    for a in agents:
        if a.runner.addresses:  # still up (a test may have stopped it)
            await a.stop()


def fenced(
    agents: list[SimAgent], session: aiohttp.ClientSession, **settings: Any
) -> TestClient[web.Request, web.Application]:
    """A gateway whose fence is `agents`, whatever becomes of them."""
    workers = [serving_worker(a.agent_id, f"http://127.0.0.1:{a.inference_port}", admin_url=a.url) for a in agents]
    return gateway_client(FixedState(serving_fleet(workers)), session, **settings)


async def test_a_worker_refusing_connections_is_ejected_at_once_and_the_request_served_by_another(
    sim_agents: list[SimAgent],
) -> None:
    live, dead = sim_agents
    await dead.stop()  # its port closed: connecting is refused
    # One try only: a refusal is not a try, so every request still reaches the live worker.
    async with (
        new_session() as session,
        fenced(sim_agents, session, attempts=1, outlier_failures=5, outlier_backoff_s=60) as client,
    ):
        gateway = client.server.app[GATEWAY]
        for _ in range(4):
            resp = await client.post(PATH, json=BODY)
            assert resp.status == 200 and resp.headers["X-RL-Worker"] == live.agent_id, await resp.text()
        # Out after its first refusal (not after outlier_failures), so it was tried once only.
        circuit = gateway.breakers.view(dead.agent_id)
        assert circuit.state == "open" and circuit.ejections == 1 and gateway.failed[dead.agent_id] == 1
        metrics = await (await client.get("/metrics")).text()
        assert f'rlcp_gateway_worker_failures_total{{stage="unreachable",worker="{dead.agent_id}"}} 1.0' in metrics
        assert f'rlcp_gateway_worker_ejected{{worker="{dead.agent_id}"}} 1.0' in metrics


async def test_a_fleet_whose_one_worker_refuses_holds_the_request_then_answers_503(
    sim_agents: list[SimAgent],
) -> None:
    agent = sim_agents[0]
    await agent.stop()
    async with new_session() as session, fenced([agent], session, hold_timeout_s=0.5, outlier_backoff_s=60) as client:
        gateway = client.server.app[GATEWAY]
        started = asyncio.get_running_loop().time()
        resp = await client.post(PATH, json=BODY)
        waited = asyncio.get_running_loop().time() - started
        answer = await resp.json()
        assert resp.status == 503 and answer["error"]["code"] == "no_capacity", answer
        assert resp.headers["Retry-After"] == "1" and "X-RL-Worker" not in resp.headers
        message = answer["error"]["message"]
        assert "refused the connection" in message and agent.agent_id in message, message
        assert waited >= 0.5  # held to its deadline, not answered at the refusal
        # Refused once: ejected, the request waited rather than knock on the closed port again.
        assert gateway.failed[agent.agent_id] == 1 and gateway.breakers.view(agent.agent_id).state == "open"


async def test_a_held_request_is_served_by_the_worker_started_again_within_its_hold(
    sim_agents: list[SimAgent],
) -> None:
    agent = sim_agents[0]
    await agent.stop()
    async with new_session() as session, fenced([agent], session, hold_timeout_s=20, outlier_backoff_s=0.2) as client:
        gateway = client.server.app[GATEWAY]
        held = asyncio.create_task(client.post(PATH, json=BODY))
        await wait_for(lambda: gateway.failed[agent.agent_id] >= 1, what="the stopped worker's refusal")
        await asyncio.sleep(0.3)  # a refused probe or two meanwhile: still held
        assert not held.done() and gateway.held == 1
        await agent.start()  # the same port again
        resp = await asyncio.wait_for(held, 15)
        assert resp.status == 200 and resp.headers["X-RL-Worker"] == agent.agent_id, await resp.text()
        assert gateway.breakers.view(agent.agent_id).state == "closed"  # the probe that served closed it

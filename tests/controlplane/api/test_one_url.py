"""One URL is the fleet: a client written for one vLLM server (TRL's clients take one base URL)
works with the gateway's URL, the controller's URL, or a standalone gateway replica's, for both
the admin routes (the facade and the native API) and inference through the fence.

- Each port hands what it does not route to the other (`rlcp.core.handover`), which authorizes
  it as on its own port: the controller's token for admin routes, whichever URL they came to.
- A standalone gateway forwards admin routes to the controller it follows, the client's own
  `Authorization` included; a controller that is down is a quick 503 naming it.
- `api.allow_anonymous` lets a client with no token drive the fleet; off, that client is a 401.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog.testing
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.gateway.admin import ControllerLink, forward_to_controller
from rlcp.controlplane.gateway.app import build_gateway_app, new_session
from rlcp.controlplane.gateway.follow import FollowedState
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.gateway.routing import Router
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings, start_controller
from rlcp.harness.faults import Fault
from rlcp.harness.fleet_state import serving_fleet
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import LoopStalls, wait_for
from tests.support.fleets import FixedState, FleetShape, GatewayFleet

pytestmark = pytest.mark.timeout(120)

ANONYMOUS = FleetShape(settings={"api": {"token": CTL_TOKEN, "allow_anonymous": True}})
COMPLETION = {"model": "sim", "prompt": "hi", "max_tokens": 3}


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    async with http.request(method, url, json=body, headers=headers or {}) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def drive_one_step(http: aiohttp.ClientSession, url: str, fleet: GatewayFleet, ckpt: Path, version: str) -> None:
    """What a trainer written for one vLLM server does with its one base URL: pause, a disk
    update, the server's state, resume, then rollouts; each call checked against the fleet."""
    agents = fleet.agents
    assert (await call(http, "POST", f"{url}/pause?mode=keep", headers=AUTH))[::2] == (200, {"status": "paused"})
    assert all(a.service.paused for a in agents)
    assert (await call(http, "GET", f"{url}/is_paused"))[::2] == (200, {"is_paused": True})
    status, _, body = await call(
        http, "POST", f"{url}/update_weights", {"weight_dir": str(ckpt), "weight_version": version}, AUTH
    )
    assert (status, body["weight_version"]) == (200, version), body
    assert all(a.service.weight_version == version for a in agents)
    status, _, state = await call(http, "GET", f"{url}/v1/rl/state")
    assert status == 200 and state["desired"]["weight_version"] == version
    assert {w["id"] for w in state["workers"]} == {a.agent_id for a in agents}
    assert (await call(http, "GET", f"{url}/weight_info"))[::2] == (200, {"weight_version": version})
    assert (await call(http, "POST", f"{url}/resume", headers=AUTH))[::2] == (200, {"status": "resumed"})
    assert not any(a.service.paused for a in agents)
    status, _, models = await call(http, "GET", f"{url}/v1/models")
    assert status == 200 and "sim" in {m["id"] for m in models["data"]}
    for _ in range(4):
        status, headers, body = await call(http, "POST", f"{url}/v1/completions", COMPLETION)
        assert status == 200 and body["choices"], body
        assert headers["X-RL-Weight-Version"] == version and headers["X-RL-Worker"] in {a.agent_id for a in agents}


async def test_a_vllm_client_given_only_the_gateway_url_drives_the_fleet_and_generates(gateway_fleet, tmp_path):
    await drive_one_step(
        gateway_fleet.http, gateway_fleet.gateway.url, gateway_fleet, write_checkpoint(tmp_path / "s1", 1), "s1"
    )


async def test_a_vllm_client_given_only_the_controller_url_drives_the_fleet_and_generates(gateway_fleet, tmp_path):
    await drive_one_step(
        gateway_fleet.http, gateway_fleet.ctl.url, gateway_fleet, write_checkpoint(tmp_path / "s1", 1), "s1"
    )


async def test_streamed_completions_come_through_the_controller_url_as_events(gateway_fleet):
    http, url = gateway_fleet.http, gateway_fleet.ctl.url
    async with http.post(f"{url}/v1/completions", json={**COMPLETION, "max_tokens": 5, "stream": True}) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert resp.headers["X-RL-Worker"] in {a.agent_id for a in gateway_fleet.agents}
        events = [line async for line in resp.content if line.startswith(b"data: ")]
    assert events[-1].strip() == b"data: [DONE]" and len(events) >= 2


async def test_each_url_answers_its_own_404_for_a_path_neither_serves(gateway_fleet):
    http = gateway_fleet.http
    for url in (gateway_fleet.gateway.url, gateway_fleet.ctl.url):
        status, _, body = await call(http, "POST", f"{url}/v1/no_such_route", {}, AUTH)
        assert status == 404 and body["error"]["message"].endswith("POST /v1/no_such_route"), body
        # A path one side serves with another method keeps that side's 405.
        status, headers, _ = await call(http, "GET", f"{url}/v1/completions")
        assert status == 405 and "POST" in headers["Allow"]


async def test_a_client_with_no_token_is_refused_on_both_urls_by_default(gateway_fleet):
    http = gateway_fleet.http
    for url in (gateway_fleet.gateway.url, gateway_fleet.ctl.url):
        status, _, body = await call(http, "POST", f"{url}/pause?mode=keep")
        assert status == 401 and body["error"]["field"] == "Authorization", body
    assert not any(a.service.paused for a in gateway_fleet.agents)


@pytest.mark.parametrize("fleet_shape", [ANONYMOUS])
async def test_a_client_with_no_token_drives_the_fleet_where_the_operator_allows_it(gateway_fleet):
    http, agents = gateway_fleet.http, gateway_fleet.agents
    for url in (gateway_fleet.gateway.url, gateway_fleet.ctl.url):
        assert (await call(http, "POST", f"{url}/pause?mode=keep"))[::2] == (200, {"status": "paused"})
        assert all(a.service.paused for a in agents)
        assert (await call(http, "POST", f"{url}/resume"))[::2] == (200, {"status": "resumed"})
        assert not any(a.service.paused for a in agents)
        # A token presented is still checked: anonymous is no header at all, not any header.
        status, _, _ = await call(http, "POST", f"{url}/pause?mode=keep", headers={"Authorization": "Bearer wrong"})
        assert status == 401
    assert not any(a.service.paused for a in agents)


async def test_a_controller_without_a_gateway_says_where_inference_is_served(tmp_path):
    agent = await SimAgent("w0", [tmp_path]).start()
    ctl = await start_controller(tmp_path, [agent], gateway={"enabled": False, "port": 0})
    try:
        status, body = await ctl.call("POST", "/v1/completions", COMPLETION)
        assert status == 404 and "no gateway runs in this controller's process" in body["error"]["message"]
        status, body = await ctl.call("POST", "/pause?mode=keep")  # its own routes are as they were
        assert status == 200 and agent.service.paused
    finally:
        await ctl.client.close()
        await agent.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _standalone(router: Router, session: aiohttp.ClientSession, controller_url: str) -> TestClient[Any, Any]:
    """A standalone gateway as `rl-gateway` builds it (`gateway/__main__.py`), in this process."""
    settings = GatewaySettings(port=0, hold_timeout_s=5, controller_connect_timeout_s=1)
    gateway = Gateway(router=router, session=session, settings=settings, metrics=GatewayMetrics())
    link = ControllerLink(url=controller_url, session=session, timeout_s=30, connect_timeout_s=1)
    return TestClient(TestServer(build_gateway_app(gateway, controller=forward_to_controller(link))))


async def test_a_standalone_gateway_forwards_admin_routes_with_the_clients_own_token(gateway_fleet):
    ctl, agents = gateway_fleet.ctl, gateway_fleet.agents
    async with new_session() as session:
        followed = FollowedState(session=session, url=ctl.url, token=None, interval_s=0.05)
        follower = asyncio.create_task(followed.run(), name="follow")
        replica = _standalone(Router(followed), session, ctl.url)
        await replica.start_server()
        try:
            # The client's token reaches the controller, and only the client's.
            resp = await replica.post("/pause?mode=keep")
            assert resp.status == 401 and (await resp.json())["error"]["field"] == "Authorization"
            assert not any(a.service.paused for a in agents)
            resp = await replica.post("/pause?mode=keep", headers=AUTH)
            assert (resp.status, await resp.json()) == (200, {"status": "paused"})
            assert all(a.service.paused for a in agents)
            resp = await replica.get("/v1/rl/state")
            assert resp.status == 200 and len((await resp.json())["workers"]) == len(agents)
            resp = await replica.post("/resume", headers=AUTH)
            assert resp.status == 200 and not any(a.service.paused for a in agents)
            await wait_for(lambda: followed.current() is not None, 10, "the replica's first state")
            resp = await replica.post("/v1/completions", json=COMPLETION)
            assert resp.status == 200 and resp.headers["X-RL-Worker"] in {a.agent_id for a in agents}
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await replica.close()


async def test_a_standalone_gateway_whose_controller_is_down_answers_503_naming_it_quickly():
    down = f"http://127.0.0.1:{_closed_port()}"
    async with new_session() as session:
        replica = _standalone(Router(FixedState(serving_fleet([]))), session, down)
        await replica.start_server()
        try:
            for method, path in (("POST", "/pause?mode=keep"), ("GET", "/v1/rl/state"), ("GET", "/is_paused")):
                async with LoopStalls() as stalls:  # the time the test's loop could not run is left out
                    started = time.monotonic()
                    resp = await replica.request(method, path, headers=AUTH)
                    body = await resp.json()
                    assert time.monotonic() - started - stalls.s < 2.0
                assert resp.status == 503 and resp.headers["Retry-After"] == "1", body
                assert body["error"]["code"] == "controller_unavailable" and down in body["error"]["message"]
        finally:
            await replica.close()


@pytest.mark.parametrize(
    "fleet_shape", [FleetShape(inference=True, settings={"api": {"token": CTL_TOKEN, "allow_anonymous": True}})]
)
async def test_the_daemons_public_port_streams_inference_and_takes_anonymous_admin_calls(daemon_fleet):
    """The daemon as it runs by default: the front on the public port, the core (and its gateway)
    behind it. The front lets inference through to the core's gateway, streamed, and applies
    `api.allow_anonymous` as the core does."""
    agents, ctl, http = daemon_fleet
    async with http.post(f"{ctl.url}/v1/completions", json={**COMPLETION, "max_tokens": 5, "stream": True}) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        assert resp.headers["X-RL-Worker"] in {a.agent_id for a in agents}
        events = [line async for line in resp.content if line.startswith(b"data: ")]
    assert events[-1].strip() == b"data: [DONE]" and len(events) >= 2
    assert (await call(http, "POST", f"{ctl.url}/pause?mode=keep"))[::2] == (200, {"status": "paused"})
    assert all(a.service.paused for a in agents)
    status, _, _ = await call(http, "POST", f"{ctl.url}/resume", headers={"Authorization": "Bearer wrong"})
    assert status == 401 and all(a.service.paused for a in agents)
    assert (await call(http, "POST", f"{ctl.url}/resume"))[::2] == (200, {"status": "resumed"})
    assert not any(a.service.paused for a in agents)


@pytest.mark.parametrize("allowed", [False, True])
def test_anonymous_admin_is_a_warning_at_start_and_only_when_allowed(tmp_path, allowed):
    settings = controller_settings(tmp_path, [], api={"token": CTL_TOKEN, "allow_anonymous": allowed})
    with structlog.testing.capture_logs() as logs:
        assemble(settings, token=CTL_TOKEN)
    warned = [e for e in logs if e["event"] == "anonymous_admin_allowed"]
    assert [e["log_level"] for e in warned] == (["warning"] if allowed else [])


async def test_an_update_sent_to_the_gateway_url_runs_to_its_end_when_the_client_gives_up(gateway_fleet, tmp_path):
    """The gateway's site cancels a handler whose client left; an admin call it hands to the
    controller is not cut by that (as on the controller's own port): no update stopped half-way."""
    agents, url = gateway_fleet.agents, gateway_fleet.gateway.url
    for a in agents:
        a.faults["/v1/agent/weights/update"] = Fault("delay", delay_s=1.5, times=1)
    body = {"weight_dir": str(write_checkpoint(tmp_path / "late", 2))}
    with pytest.raises(TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as impatient:
            await impatient.post(f"{url}/update_weights", json=body, headers=AUTH)
    await wait_for(
        lambda: all(a.service.weight_version == "late" and not a.service.paused for a in agents),
        10,
        "the update to finish on every worker, and the fleet to resume",
    )

    # Its own record says it ran to its end (not `interrupted`: the reconciler alone would bring
    # the workers to the desired version too, so their version does not say it). The workers are
    # resumed a moment before the controller closes the record: wait for it to close.
    async def update_record() -> dict | None:
        status, _, records = await call(gateway_fleet.http, "GET", f"{url}/v1/rl/operations")
        assert status == 200, records
        update = next(r for r in records["operations"] if r["kind"] == "update_weights")
        return update if update["status"] != "running" else None

    update = await wait_for(update_record, 30, "the update's record to close")
    assert update["status"] == "ok", update

"""What reaches a worker through the gateway besides the body: neither token the gateway
knows (its own, the controller's it accepts), while any other `Authorization` (a key the worker
itself checks, with the gateway open) passes; the client's request id and trace go on, with a
span of the gateway's own. The worker here is a real HTTP server on loopback that answers with
the headers it was sent."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.gateway.app import build_gateway_app, new_session
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.gateway.routing import Router
from rlcp.controlplane.settings import GatewaySettings
from rlcp.core.wire.controller import AppliedState, DesiredState, FleetState, RequestCounts, WorkerView

pytestmark = pytest.mark.timeout(60)


class FixedState:
    def __init__(self, state: FleetState) -> None:
        self.state = state

    def current(self) -> tuple[int, FleetState]:
        return 1, self.state


def one_worker(url: str) -> FleetState:
    worker = WorkerView(
        id="echo",
        admin_url="http://127.0.0.1:1",
        inference_url=url,
        flavor="vllm",
        world_size=1,
        reachable=True,
        ready=True,
        serving=True,
        paused=False,
        requests=None,
        weight_version="v1",
        loras={},
        engine_alive=True,
    )
    return FleetState(
        phase="serving",
        quiesced=False,
        pause_state="running",
        requests=RequestCounts(running=0, waiting=0, frozen=0),
        desired=DesiredState(weight_version="v1", applied_versions=["v1"]),
        applied=AppliedState(weight_version="v1", converged=True, verified=True),
        membership_epoch=1,
        discovery_synced=True,
        last_operation=None,
        workers=[worker],
    )


@pytest.fixture
async def echo_worker() -> AsyncIterator[str]:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"headers": dict(request.headers)})

    app = web.Application()
    app.router.add_post("/v1/completions", echo)
    async with TestServer(app) as server:
        yield str(server.make_url("")).rstrip("/")


async def gateway_client(worker_url: str, session: aiohttp.ClientSession, **settings: object) -> TestClient:
    gateway = Gateway(
        router=Router(FixedState(one_worker(worker_url))),
        session=session,
        settings=GatewaySettings(**settings),
        metrics=GatewayMetrics(),
        admin_token="admin-token",
    )
    return TestClient(TestServer(build_gateway_app(gateway)))


async def sent_upstream(client: TestClient, authorization: str | None) -> tuple[int, dict[str, str]]:
    headers = {"Authorization": authorization} if authorization else {}
    resp = await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers=headers)
    body = await resp.json()
    return resp.status, body.get("headers", {})


async def test_the_gateways_tokens_stop_at_the_gateway(echo_worker: str) -> None:
    async with new_session() as session, await gateway_client(echo_worker, session, token="own-token") as client:
        for token in ("own-token", "admin-token"):
            status, upstream = await sent_upstream(client, f"Bearer {token}")
            assert status == 200 and "Authorization" not in upstream, (token, upstream)
            assert upstream["X-RL-Expect-Weight-Version"] == "v1"
        assert (await sent_upstream(client, "Bearer other"))[0] == 401


async def test_an_open_gateway_passes_a_workers_own_key(echo_worker: str) -> None:
    async with new_session() as session, await gateway_client(echo_worker, session) as client:
        status, upstream = await sent_upstream(client, "Bearer the-workers-key")
        assert status == 200 and upstream["Authorization"] == "Bearer the-workers-key"
        status, upstream = await sent_upstream(client, "Bearer admin-token")  # the controller's: not the worker's
        assert status == 200 and "Authorization" not in upstream


async def test_the_request_id_and_trace_go_on_to_the_worker(echo_worker: str) -> None:
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with new_session() as session, await gateway_client(echo_worker, session) as client:
        resp = await client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "p"},
            headers={"x-request-id": "rollout-17", "traceparent": f"00-{trace}-{span}-01"},
        )
        upstream = (await resp.json())["headers"]
        assert resp.headers["X-Request-ID"] == upstream["X-Request-ID"] == "rollout-17"
        version, trace_id, parent, flags = upstream["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", trace, "01") and parent != span  # a span of its own
        assert [k.lower() for k in upstream].count("x-request-id") == 1
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": "p"})
        made = (await resp.json())["headers"]["X-Request-ID"]
        assert made and resp.headers["X-Request-ID"] == made  # one made here when the client sent none

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

from rlcp.controlplane.gateway.app import new_session
from rlcp.harness.fleet_state import serving_fleet, serving_worker
from tests.support.fleets import FixedState, gateway_client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def echo_worker() -> AsyncIterator[str]:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"headers": dict(request.headers)})

    app = web.Application()
    app.router.add_post("/v1/completions", echo)
    async with TestServer(app) as server:
        yield str(server.make_url("")).rstrip("/")


def echo_gateway(worker_url: str, session: aiohttp.ClientSession, **settings: object) -> TestClient:
    state = FixedState(
        serving_fleet([serving_worker("echo", worker_url, flavor="vllm", admin_url="http://127.0.0.1:1")])
    )
    return gateway_client(state, session, admin_token="admin-token", **settings)


async def sent_upstream(client: TestClient, authorization: str | None) -> tuple[int, dict[str, str]]:
    headers = {"Authorization": authorization} if authorization else {}
    resp = await client.post("/v1/completions", json={"model": "m", "prompt": "p"}, headers=headers)
    body = await resp.json()
    return resp.status, body.get("headers", {})


async def test_the_gateways_tokens_stop_at_the_gateway(echo_worker: str) -> None:
    async with new_session() as session, echo_gateway(echo_worker, session, token="own-token") as client:
        for token in ("own-token", "admin-token"):
            status, upstream = await sent_upstream(client, f"Bearer {token}")
            assert status == 200 and "Authorization" not in upstream, (token, upstream)
            assert upstream["X-RL-Expect-Weight-Version"] == "v1"
        assert (await sent_upstream(client, "Bearer other"))[0] == 401


async def test_an_open_gateway_passes_a_workers_own_key(echo_worker: str) -> None:
    async with new_session() as session, echo_gateway(echo_worker, session) as client:
        status, upstream = await sent_upstream(client, "Bearer the-workers-key")
        assert status == 200 and upstream["Authorization"] == "Bearer the-workers-key"
        status, upstream = await sent_upstream(client, "Bearer admin-token")  # the controller's: not the worker's
        assert status == 200 and "Authorization" not in upstream


async def test_the_request_id_and_trace_go_on_to_the_worker(echo_worker: str) -> None:
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with new_session() as session, echo_gateway(echo_worker, session) as client:
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

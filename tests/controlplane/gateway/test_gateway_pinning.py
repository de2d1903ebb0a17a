"""The gateway's per-flavor amendment for Dynamo members (`gateway/pinning.py`): the body that
reaches the frontend carries the chosen member's `nvext.backend_instance_id`, merged into the
client's `nvext`; a frontend's refusal of the pin fails that member over, never answers.

The frontend here is a loopback HTTP server that records bodies and answers the way Dynamo
1.6.1's frontend answers an unknown instance id (its exact body, seen in
tests/e2e/test_dynamo_rollouts.py, where the real frontend proves the pinning itself)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.gateway.app import new_session
from rlcp.controlplane.gateway.pinning import instance_number, pin_refused, pinned_body
from rlcp.core.wire.controller.state import FleetState
from rlcp.harness.fleet_state import serving_fleet, serving_worker
from tests.support.fleets import FixedState, gateway_client

pytestmark = pytest.mark.timeout(60)
LIVE, GONE = "17331665436039265135", "5345159356521062744"  # Dynamo ids are u64, above i64's range
REFUSAL = {"message": "Invalid request", "type": "Bad Request", "code": 400}


def test_the_pin_merges_into_the_clients_nvext() -> None:
    body = json.dumps(
        {"model": "tiny", "messages": [], "nvext": {"token_data": [1, 2], "extra_fields": ["engine_data"]}}
    )
    sent = json.loads(pinned_body(body.encode(), LIVE))
    assert sent["nvext"] == {"token_data": [1, 2], "extra_fields": ["engine_data"], "backend_instance_id": int(LIVE)}
    assert sent["model"] == "tiny" and sent["messages"] == []
    assert json.loads(pinned_body(b'{"model": "tiny"}', LIVE))["nvext"] == {"backend_instance_id": int(LIVE)}
    with pytest.raises(ValueError, match="worker agent-0 .* not a Dynamo instance id"):
        pinned_body(b"{}", "agent-0")
    assert instance_number(str(2**64)) is None and instance_number("0") == 0


def test_only_the_frontends_own_refusal_is_a_refused_pin() -> None:
    assert "no longer lists" in (pin_refused(400, json.dumps(REFUSAL).encode()) or "")
    # What the frontend answered for a killed worker it still listed.
    gone = b'{"message":"Service temporarily unavailable","type":"Service Unavailable","code":503}'
    assert "could not reach it (HTTP 503 " in (pin_refused(503, gone) or "")
    # A client's bad field is named in the message: the client's error, passed on.
    named = {"message": "Failed to deserialize the JSON body into the target type: invalid type", "code": 400}
    assert pin_refused(400, json.dumps(named).encode()) is None
    assert pin_refused(404, json.dumps(REFUSAL).encode()) is None and pin_refused(400, b"not json") is None


def dynamo_fleet(frontend: str, ids: list[str]) -> FleetState:
    return serving_fleet(
        [serving_worker(i, frontend, flavor="dynamo", admin_url=f"http://127.0.0.1:{n + 1}") for n, i in enumerate(ids)]
    )


@pytest.fixture
async def frontend() -> AsyncIterator[tuple[str, list[dict]]]:
    seen: list[dict] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if body["nvext"]["backend_instance_id"] != int(LIVE):
            return web.json_response(REFUSAL, status=400)
        return web.json_response({"choices": [], "nvext": {"engine_data": {"completion_token_ids": [7]}}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app) as server:
        yield str(server.make_url("")).rstrip("/"), seen


def dynamo_gateway(frontend_url: str, session: aiohttp.ClientSession, ids: list[str]) -> TestClient:
    return gateway_client(FixedState(dynamo_fleet(frontend_url, ids)), session, hold_timeout_s=1.0)


CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "nvext": {"token_data": [1, 2, 3], "extra_fields": ["engine_data"]},
}


async def test_a_refused_pin_fails_over_to_a_member_the_frontend_knows(frontend) -> None:
    url, seen = frontend
    async with new_session() as session, dynamo_gateway(url, session, [GONE, LIVE]) as client:
        for _ in range(4):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers={"X-Session-ID": "s"})
            assert resp.status == 200, await resp.text()
            assert resp.headers["X-RL-Worker"] == LIVE and resp.headers["X-RL-Weight-Version"] == "v1"
    assert all(b["nvext"]["token_data"] == [1, 2, 3] and b["nvext"]["extra_fields"] == ["engine_data"] for b in seen)
    assert {b["nvext"]["backend_instance_id"] for b in seen} <= {int(LIVE), int(GONE)}


async def test_when_every_pin_is_refused_the_answer_names_the_workers(frontend) -> None:
    url, _ = frontend
    async with new_session() as session, dynamo_gateway(url, session, [GONE]) as client:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        body = await resp.json()
    assert resp.status == 502, body
    assert GONE in body["error"]["message"] and "no longer lists" in body["error"]["message"], body


async def test_the_client_does_not_choose_the_instance(frontend) -> None:
    url, seen = frontend
    async with new_session() as session, dynamo_gateway(url, session, [LIVE]) as client:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "nvext": {"backend_instance_id": 1}})
        body = await resp.json()
        assert resp.status == 400 and body["error"]["field"] == "nvext.backend_instance_id", body
        resp = await client.post("/v1/chat/completions", json={**CHAT, "nvext": [1]})
        body = await resp.json()
        assert resp.status == 400 and body["error"]["field"] == "nvext", body
    assert seen == []  # nothing reached the frontend


@pytest.mark.parametrize(
    "meanwhile",
    [{"weight_version": "v2"}, {"cordoned": True}, {"paused": True}],
    ids=["new-weights", "cordoned", "paused"],
)
async def test_an_answer_from_a_member_that_left_service_meanwhile_is_not_handed_on(meanwhile: dict) -> None:
    # A request queued in the engine (not yet running) when the member paused runs after the
    # resume, on the new weights (vLLM's wait-mode pause drains only what runs). Here the
    # member's version moves while the frontend holds the first request.
    state = FixedState(dynamo_fleet("", [LIVE, GONE]))
    answered: list[int] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        instance = body["nvext"]["backend_instance_id"]
        answered.append(instance)
        if len(answered) == 1:
            workers = [w.model_copy(update=meanwhile) if w.id == str(instance) else w for w in state.state.workers]
            state.set(state.state.model_copy(update={"workers": workers}))
        return web.json_response({"choices": [], "served_by": instance})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app) as server, new_session() as session:
        url = str(server.make_url("")).rstrip("/")
        state.set(dynamo_fleet(url, [LIVE, GONE]))
        async with gateway_client(state, session, hold_timeout_s=1.0) as client:
            resp = await client.post("/v1/chat/completions", json=CHAT)
            body = await resp.json()
    assert resp.status == 200, body
    assert len(answered) == 2 and answered[0] != answered[1]  # the first member's answer was dropped
    assert body["served_by"] == answered[1] and resp.headers["X-RL-Worker"] == str(answered[1])
    assert resp.headers["X-RL-Weight-Version"] == "v1"

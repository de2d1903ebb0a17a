"""The guarded engine passthrough (`POST /v1/rl/engine/{route}`) over a sim fleet (real agent
code on SimEngine): an allowlisted route runs on the whole fleet, a selector's members or one
worker, as an operation with a result and the answer per worker; a route outside the allowlist
is a 403 naming it and reaches no worker; the touched workers' statuses are read again after it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcp.harness.controller import start_controller
from rlcp.harness.faults import Fault
from rlcp.harness.simfleet import SimAgent
from tests.support.fleets import ROLES, Labelled

pytestmark = pytest.mark.timeout(120)
# Slow polls and reconciles: what the state shows after a call is the call's own re-read.
QUIET = {"reconcile": {"poll_interval_s": 60, "interval_s": 60, "backoff_initial_s": 0.1, "backoff_max_s": 0.5}}


@pytest.fixture
async def fleet(tmp_path: Path) -> Any:
    agents = [await SimAgent(wid, [tmp_path]).start() for wid in ROLES]
    ctl = await start_controller(tmp_path, [Labelled(a, ROLES[a.agent_id]) for a in agents], **QUIET)
    yield ctl, {a.agent_id: a for a in agents}
    await ctl.client.close()
    for a in agents:
        await a.stop()


def reached(agent: SimAgent, call: str) -> int:
    return sum(1 for c, *_ in agent.traced if c == call)


async def test_an_allowed_route_runs_on_the_fleet_a_selector_or_one_worker(fleet: Any) -> None:
    ctl, agents = fleet
    status, result = await ctl.call("POST", "/v1/rl/engine/is_paused", {})
    assert status == 200, result
    assert result["kind"] == "engine" and result["status"] == "ok"
    assert sorted(r["worker_id"] for r in result["results"]) == ["w0", "w1", "w2"]
    assert {r["phase"] for r in result["results"]} == {"engine:is_paused"}
    assert result["detail"]["answers"] == {w: {"is_paused": False} for w in ROLES}
    assert result["detail"]["method"] == "GET" and result["detail"]["route"] == "is_paused"
    assert all(reached(a, "GET /is_paused") == 1 for a in agents.values())

    status, result = await ctl.call("POST", "/v1/rl/engine/is_paused", {"selector": "role=reference"})
    assert status == 200 and [r["worker_id"] for r in result["results"]] == ["w2"]
    status, result = await ctl.call("POST", "/v1/rl/engine/weight_info", {"worker": "w1"})
    assert status == 200 and [r["worker_id"] for r in result["results"]] == ["w1"]
    assert result["detail"]["answers"]["w1"] == {"weight_version": agents["w1"].service.weight_version}
    assert [reached(agents[w], "GET /is_paused") for w in ROLES] == [1, 1, 2]
    assert [reached(agents[w], "GET /weight_info") for w in ROLES] == [0, 1, 0]

    status, ops = await ctl.call("GET", "/v1/rl/operations", headers={})
    assert [o["kind"] for o in ops["operations"][:3]] == ["engine"] * 3


async def test_a_post_route_passes_its_body_and_the_touched_workers_are_read_again(fleet: Any) -> None:
    ctl, agents = fleet
    # Paused behind the controller's back: with polls a minute apart, only the re-read after
    # the call can show it.
    await agents["w0"].service.control.pause("keep", 5)
    assert ctl.worker(await ctl.state(), "w0")["paused"] is False
    status, result = await ctl.call(
        "POST", "/v1/rl/engine/abort_requests", {"worker": "w0", "body": {"request_ids": ["nope"]}}
    )
    assert status == 200, result
    assert result["detail"]["answers"]["w0"] == {"status": "aborted", "aborted": 0}
    assert agents["w0"].touched[-1] == "POST /abort_requests"
    assert ctl.worker(await ctl.state(), "w0")["paused"] is True


async def test_an_engine_refusal_comes_back_as_its_4xx_and_a_fleet_failure_as_502(fleet: Any) -> None:
    ctl, agents = fleet
    # A body the engine refuses (its 422) is the client's error, not the fleet's: that 4xx, naming
    # the worker and what it answered, with the operation and every worker's result.
    status, answer = await ctl.call("POST", "/v1/rl/engine/abort_requests", {"worker": "w0", "body": {"x": 1}})
    assert status == 422, answer
    error = answer["error"]
    assert error["code"] == "engine_rejected" and "w0" in error["message"] and "422" in error["message"], error
    assert list(error["workers"]) == ["w0"] and "answered 422" in error["workers"]["w0"]
    assert [(r["worker_id"], r["status"]) for r in error["operation"]["results"]] == [("w0", "error")]
    assert error["operation"]["kind"] == "engine" and error["operation"]["status"] == "failed"
    status, ops = await ctl.call("GET", "/v1/rl/operations", headers={})
    assert error["operation"]["id"] in [o["id"] for o in ops["operations"]]  # recorded, as every operation
    # Every member refusing: the same 4xx, each named.
    status, answer = await ctl.call("POST", "/v1/rl/engine/abort_requests", {"body": {"x": 1}})
    assert status == 422 and sorted(answer["error"]["workers"]) == ["w0", "w1", "w2"], answer
    # A 5xx, a broken connection, or a status about the controller's own link (401) is the fleet's
    # failure: 502 with the operation's result, whatever the others answered.
    agents["w0"].faults["/abort_requests"] = Fault("status", 500)
    agents["w1"].faults["/abort_requests"] = Fault("reset")
    agents["w2"].faults["/abort_requests"] = Fault("status", 401)
    for target in ({"worker": "w0"}, {"worker": "w1"}, {"worker": "w2"}, {}):
        status, result = await ctl.call("POST", "/v1/rl/engine/abort_requests", target | {"body": {}})
        assert status == 502 and result["status"] == "failed", (target, result)
    agents["w1"].faults.clear()
    # One refusing (422), another failing (500): still the fleet's failure.
    status, result = await ctl.call(
        "POST", "/v1/rl/engine/abort_requests", {"selector": "role=policy", "body": {"x": 1}}
    )
    assert status == 502 and {r["worker_id"]: r["status"] for r in result["results"]} == {
        "w0": "error",
        "w1": "error",
    }, result
    agents["w2"].faults.clear()
    # One took it, one refused: a partial result, 207, as every operation.
    agents["w0"].faults["/abort_requests"] = Fault("status", 422)
    status, result = await ctl.call("POST", "/v1/rl/engine/abort_requests", {"selector": "role=policy", "body": {}})
    assert status == 207 and {r["worker_id"]: r["status"] for r in result["results"]} == {"w0": "error", "w1": "ok"}, (
        result
    )


@pytest.mark.parametrize(
    "route,body,code,field,why",
    [
        ("sleep", {}, 403, "route", "engine route 'sleep' is not allowed for flavor agent"),
        ("collective_rpc", {"body": {"method": "x"}}, 403, "route", "'collective_rpc' is not allowed"),
        ("pause", {"worker": "w0"}, 403, "route", "allowed: agent: abort_requests, get_world_size, is_paused"),
        ("is_paused", {"body": {}}, 422, "body", "is a GET: it takes no body"),
        ("is_paused", {"worker": "w0", "selector": "role=policy"}, 422, "selector", "not both"),
        ("is_paused", {"worker": "w9"}, 404, "worker", "no member 'w9'"),
        ("is_paused", {"selector": "role=teacher"}, 422, "selector", "matches none"),
        ("is_paused", {"selector": "role in"}, 422, "selector", "expected '('"),
        ("is_paused", {"route": "x"}, 422, "route", "Extra inputs"),
    ],
)
async def test_refusals_reach_no_worker_and_log_nothing(
    fleet: Any, route: str, body: dict, code: int, field: str, why: str
) -> None:
    ctl, agents = fleet
    _, ops_before = await ctl.call("GET", "/v1/rl/operations", headers={})
    calls = {w: len(a.traced) for w, a in agents.items()}
    status, answer = await ctl.call("POST", f"/v1/rl/engine/{route}", body)
    assert status == code, answer
    assert answer["error"]["field"] == field and why in answer["error"]["message"], answer
    if code == 403:
        assert answer["error"]["code"] == "route_forbidden"
    assert {w: len([c for c, *_ in a.traced[calls[w] :] if c != "GET /v1/agent/state"]) for w, a in agents.items()} == {
        w: 0 for w in agents
    }
    _, ops = await ctl.call("GET", "/v1/rl/operations", headers={})
    assert ops == ops_before


async def test_the_admin_token_is_required(fleet: Any) -> None:
    ctl, agents = fleet
    status, _ = await ctl.call("POST", "/v1/rl/engine/is_paused", {}, headers={})
    assert status == 401
    assert all(reached(a, "GET /is_paused") == 0 for a in agents.values())


async def test_an_empty_fleet_is_503_for_every_target_form(tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from rlcp.controlplane.assembly import assemble
    from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings

    app = assemble(controller_settings(tmp_path, []), token=CTL_TOKEN)
    async with TestClient(TestServer(app)) as client:
        for body in ({}, {"selector": "role=policy"}, {"worker": "w0"}):
            resp = await client.post("/v1/rl/engine/is_paused", json=body, headers=AUTH)
            assert resp.status == 503 and (await resp.json())["error"]["code"] == "no_members", body
        resp = await client.post("/v1/rl/pause", json={"selector": "role=policy"}, headers=AUTH)
        assert resp.status == 503


async def test_rlctl_engine(fleet: Any) -> None:
    from rlcp.harness.controller import rlctl

    ctl, agents = fleet
    rc, out, err = await rlctl(ctl.url, "engine", "is_paused", "-l", "role=policy")
    assert rc == 0, err
    assert "w0" in out and "w1" in out and "w2" not in out
    rc, out, err = await rlctl(
        ctl.url, "-o", "json", "engine", "abort_requests", "--worker", "w2", "--body", '{"request_ids": []}'
    )
    assert rc == 0, err
    assert json.loads(out)["detail"]["answers"] == {"w2": {"status": "aborted", "aborted": 0}}
    rc, out, err = await rlctl(ctl.url, "engine", "sleep")
    assert rc == 2 and "'sleep' is not allowed" in err
    assert all(a.touched.count("POST /abort_requests") == (1 if w == "w2" else 0) for w, a in agents.items())

"""A model name is served by exactly one fleet (docs/controller.md, "Fleets"), over two sim fleets (test_fleets.py's:
the default one serving `policy-m`, the teacher fleet `teacher-m`).

The gateway routes a request by its `model` to the fleet serving that name, so a name given to
a second fleet takes the first one's traffic: an adapter loaded in the teacher fleet under
`policy-m` once took every `policy-m` rollout, answered 200 by the teacher's weights. Every way
a fleet is asked to serve a name is refused when another fleet serves it: an adapter load (the
native route and the vLLM-shaped facade's two) is a 409 naming both fleets before any worker
is touched, and settings that give one name to two fleets do not start.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from rlcp.controlplane.assembly import GATEWAY
from rlcp.controlplane.settings import ControllerSettings
from rlcp.harness.checkpoints import write_adapter
from rlcp.harness.controller import Ctl
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.controlplane.test_fleets import TEACHER, complete, serving, start, state

pytestmark = pytest.mark.timeout(120)
POLL = "GET /v1/agent/state"  # the status observer's read: the one request a refused load may not add to


@pytest.fixture
async def fleets(tmp_path: Path) -> AsyncIterator[tuple[Ctl, list[SimAgent], str]]:
    ctl, agents = await start(tmp_path, {"teacher": {"selector": "role=teacher"}})
    await wait_for(lambda: serving(ctl, ""), 10, "the policy fleet serving")
    await wait_for(lambda: serving(ctl, TEACHER), 10, "the teacher fleet serving")
    # The reconciler's first pass tells each agent the desired version: done before a test counts
    # the requests that reach the agents, so any it sees are the refused load's.
    await wait_for(lambda: _told(agents), 10, "every agent told the desired version")
    yield ctl, agents, ctl.client.server.app[GATEWAY].url
    await ctl.client.close()
    for a in agents:
        await a.stop()


async def _told(agents: list[SimAgent]) -> bool:
    return all("PUT /v1/agent/desired" in a.touched for a in agents)


def load(route: str, name: str, path: Path) -> tuple[str, dict[str, Any]]:
    """A LoRA load's route and body, in the native shape or vLLM's."""
    if route.endswith("/v1/rl/loras"):
        return route, {"name": name, "path": str(path)}
    return route, {"lora_name": name, "lora_path": str(path)}


def calls_since(agents: list[SimAgent], marks: dict[str, int]) -> dict[str, list[str]]:
    """Every request but the status poll that reached each agent since `marks`."""
    return {a.agent_id: [c for c, _, _ in a.traced[marks[a.agent_id] :] if c != POLL] for a in agents}


async def routed_to(gateway: str, model: str, n: int = 8) -> set[str]:
    workers = set()
    async with aiohttp.ClientSession() as http:
        for _ in range(n):
            status, headers, body = await complete(http, gateway, model)
            assert status == 200, body
            workers.add(headers["X-RL-Worker"])
    return workers


@pytest.mark.parametrize(
    "fleet, route, name, serving_fleet",
    [
        ("teacher", f"{TEACHER}/v1/rl/loras", "policy-m", "default"),  # the adversary's: the default fleet's base model
        ("teacher", f"{TEACHER}/load_lora_adapter", "policy-m", "default"),
        ("teacher", f"{TEACHER}/v1/load_lora_adapter", "policy-m", "default"),
        ("default", "/v1/rl/loras", "teacher-m", "teacher"),
        ("default", "/load_lora_adapter", "teacher-m", "teacher"),
    ],
)
async def test_an_adapter_under_a_name_another_fleet_serves_is_a_409_naming_both_before_any_worker(
    fleets, tmp_path: Path, fleet: str, route: str, name: str, serving_fleet: str
) -> None:
    ctl, agents, gateway = fleets
    adapter = write_adapter(tmp_path / "adapter")
    marks = {a.agent_id: len(a.traced) for a in agents}
    status, body = await ctl.call("POST", *load(route, name, adapter))
    assert status == 409, body
    error = body["error"]
    assert (error["code"], error["model"], error["served_by"], error["fleet"]) == (
        "model_name_taken",
        name,
        serving_fleet,
        fleet,
    ), error
    assert f"fleet {fleet!r}" in error["message"] and f"fleet {serving_fleet!r}" in error["message"], error
    assert calls_since(agents, marks) == {a.agent_id: [] for a in agents}  # no worker was asked anything
    assert all(name not in a.engine.served_lora_names() for a in agents)
    base = "" if fleet == "default" else TEACHER
    assert name not in (await state(ctl, base))["desired"]["loras"]
    owners = {"policy-m": {"p0", "p1"}, "teacher-m": {"t0", "t1"}}
    assert await routed_to(gateway, name) == owners[name]  # still its one fleet's
    assert (
        await routed_to(gateway, "teacher-m" if name == "policy-m" else "policy-m")
        == owners["teacher-m" if name == "policy-m" else "policy-m"]
    )


async def test_an_adapter_one_fleet_loaded_is_its_name_the_other_fleet_cannot_load(fleets, tmp_path: Path) -> None:
    ctl, agents, gateway = fleets
    adapter = write_adapter(tmp_path / "adapter")
    status, result = await ctl.call("POST", f"{TEACHER}/v1/rl/loras", {"name": "critic", "path": str(adapter)})
    assert status == 200, result
    marks = {a.agent_id: len(a.traced) for a in agents}
    status, body = await ctl.call("POST", "/v1/rl/loras", {"name": "critic", "path": str(adapter)})
    assert status == 409 and (body["error"]["served_by"], body["error"]["fleet"]) == ("teacher", "default"), body
    assert calls_since(agents, marks) == {a.agent_id: [] for a in agents}
    await wait_for(lambda: _routes(ctl, "critic"), 10, "the teacher fleet naming critic")
    assert await routed_to(gateway, "critic") == {"t0", "t1"}
    # The same fleet loads it again (a hot swap): its own name.
    status, result = await ctl.call("POST", f"{TEACHER}/v1/rl/loras", {"name": "critic", "path": str(adapter)})
    assert status == 200, result


async def _routes(ctl: Ctl, model: str) -> bool:
    return model in (await state(ctl, TEACHER))["models"]


async def test_two_loads_of_one_name_into_two_fleets_at_once_do_not_both_succeed(fleets, tmp_path: Path) -> None:
    ctl, agents, gateway = fleets
    adapter = write_adapter(tmp_path / "adapter")
    for a in agents:  # each load waits in its adapter check, so both are in flight together
        a.faults.add("POST", "/v1/agent/weights/check", _delay(0.3))
    (s1, b1), (s2, b2) = await asyncio.gather(
        ctl.call("POST", "/v1/rl/loras", {"name": "shared", "path": str(adapter)}),
        ctl.call("POST", f"{TEACHER}/v1/rl/loras", {"name": "shared", "path": str(adapter)}),
    )
    assert sorted([s1, s2]) == [200, 409], (b1, b2)
    refused = b1 if s1 == 409 else b2
    winner = "default" if s1 == 200 else "teacher"
    assert (refused["error"]["served_by"], refused["error"]["fleet"]) == (
        winner,
        "teacher" if winner == "default" else "default",
    ), refused
    holders = {a.agent_id for a in agents if "shared" in a.engine.served_lora_names()}
    assert holders == ({"p0", "p1"} if winner == "default" else {"t0", "t1"})


def _delay(seconds: float) -> Any:
    from rlcp.harness.faults import Fault

    return Fault("delay", delay_s=seconds)


@pytest.mark.parametrize(
    "settings, says",
    [
        (
            {"fleets": {"a": {"selector": "role=a", "models": ["m"]}, "b": {"selector": "role=b", "models": ["m"]}}},
            "model name 'm' is given to fleet 'a' (fleets.a.models) and to fleet 'b' (fleets.b.models)",
        ),
        (
            {
                "fleets": {"teacher": {"selector": "role=teacher", "models": ["policy-m"]}},
                "discovery": {
                    "kind": "static",
                    "static": [{"id": "p0", "admin_url": "http://p0", "model": "policy-m"}],
                },
            },
            "model name 'policy-m' is given to fleet 'teacher' (fleets.teacher.models) and to fleet 'default' "
            "(discovery.static member 'p0''s model)",
        ),
        (
            {
                "fleets": {"teacher": {"selector": "role=teacher"}},
                "discovery": {
                    "kind": "static",
                    "static": [
                        {"id": "p0", "admin_url": "http://p0", "model": "m"},
                        {"id": "t0", "admin_url": "http://t0", "model": "m", "labels": {"role": "teacher"}},
                    ],
                },
            },
            "fleet 'default' (discovery.static member 'p0''s model) and to fleet 'teacher'",
        ),
    ],
)
def test_settings_giving_one_model_name_to_two_fleets_do_not_start(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as info:
        ControllerSettings(**settings)
    assert says in str(info.value), info.value


def test_settings_may_give_a_name_to_one_fleet_and_its_members() -> None:
    ControllerSettings(
        fleets={"teacher": {"selector": "role=teacher", "models": ["t"]}},
        discovery={
            "kind": "static",
            "static": [
                {"id": "t0", "admin_url": "http://t0", "model": "t", "labels": {"role": "teacher"}},
                {"id": "t1", "admin_url": "http://t1", "model": "t", "labels": {"role": "teacher"}},
            ],
        },
    )


@pytest.mark.parametrize("flavor, route", [("vllm", "load_lora_adapter"), ("dynamo", "load_lora")])
def test_the_engine_passthrough_may_not_be_allowed_a_route_that_loads_an_adapter(flavor: str, route: str) -> None:
    """The passthrough would give a fleet an adapter's name without the check above."""
    with pytest.raises(ValidationError, match=f"route '{route}' loads an adapter"):
        ControllerSettings(engine_routes={"allow": {flavor: {route: "POST"}}})

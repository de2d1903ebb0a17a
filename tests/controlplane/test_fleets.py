"""Several fleets in one controller (settings `fleets`), over sim agents on loopback: a policy
fleet (the default one, served at the root) and a teacher fleet (selector `role=teacher`,
served under /fleets/teacher/), each agent serving its own model name. Each fleet keeps its
own members, desired state (its own store), operations and fence; the gateway routes each
request by its `model` to the fleet that serves it, inside that fleet's fence; a fleet's base
URL takes the whole API, the vLLM-shaped facade included. A member relabelled changes fleet."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from rlcp.controlplane.assembly import GATEWAY
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.fleets import Fleets, partition
from rlcp.controlplane.persistence.memory import MemoryStore
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.labels import parse_selector
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import (
    AUTH,
    CTL_TOKEN,
    Ctl,
    controller_config,
    rlctl,
    start_controller,
    update_body,
    wait_reachable,
)
from rlcp.harness.memory import MemoryFleet
from rlcp.harness.processes import ControllerProcess, GatewayProcess
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import Labelled

pytestmark = pytest.mark.timeout(120)

MODELS = {"p0": "policy-m", "p1": "policy-m", "t0": "teacher-m", "t1": "teacher-m"}
ROLE = {"policy-m": "policy", "teacher-m": "teacher"}
TEACHER = "/fleets/teacher"


async def start(tmp_path: Path, fleets: dict[str, Any]) -> tuple[Ctl, list[SimAgent]]:
    agents = [
        await SimAgent(wid, [tmp_path], model=model, serve_inference=True).start() for wid, model in MODELS.items()
    ]
    try:
        ctl = await start_controller(tmp_path, [Labelled(a, {"role": ROLE[a.model]}) for a in agents], fleets=fleets)
    except BaseException:
        for a in agents:
            await a.stop()
        raise
    return ctl, agents


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[Ctl, str]]:
    ctl, agents = await start(tmp_path, {"teacher": {"selector": "role=teacher"}})
    await wait_for(lambda: serving(ctl, ""), 10, "the policy fleet serving")
    await wait_for(lambda: serving(ctl, TEACHER), 10, "the teacher fleet serving")
    yield ctl, ctl.client.server.app[GATEWAY].url
    await ctl.client.close()
    for a in agents:
        await a.stop()


async def state(ctl: Ctl, base: str) -> dict[str, Any]:
    status, body = await ctl.call("GET", f"{base}/v1/rl/state", headers={})
    assert status == 200, body
    return body


async def serving(ctl: Ctl, base: str) -> bool:
    st = await state(ctl, base)
    return (
        bool(st["workers"])
        and all(w["serving"] for w in st["workers"])
        and st["gateway"] is not None
        and all(w["in_fence"] for w in st["gateway"]["workers"])
        and len(st["gateway"]["workers"]) == len(st["workers"])
    )


def versions(st: dict[str, Any]) -> dict[str, str | None]:
    return {w["id"]: w["weight_version"] for w in st["workers"]}


async def complete(http: aiohttp.ClientSession, gateway: str, model: str, **headers: str) -> tuple[int, Any, Any]:
    async with http.post(
        gateway + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}, headers=headers
    ) as resp:
        return resp.status, resp.headers, await resp.json()


async def test_each_fleet_keeps_its_own_members_desired_state_store_and_operations(fleet, tmp_path: Path) -> None:
    ctl, _ = fleet
    root, teacher = await state(ctl, ""), await state(ctl, TEACHER)
    assert (root["fleet"], sorted(versions(root))) == ("default", ["p0", "p1"])
    assert (teacher["fleet"], sorted(versions(teacher))) == ("teacher", ["t0", "t1"])
    status, listing = await ctl.call("GET", "/v1/rl/fleets", headers={})
    assert status == 200
    assert [(f["name"], f["path"], f["selector"], f["members"], f["serving"]) for f in listing["fleets"]] == [
        ("default", "", None, 2, 2),
        ("teacher", TEACHER, "role=teacher", 2, 2),
    ]
    assert [f["models"] for f in listing["fleets"]] == [["policy-m"], ["teacher-m"]]

    write_checkpoint(tmp_path / "p-2", 2)
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("p-2", tmp_path / "p-2"))
    assert status == 200 and sorted(r["worker_id"] for r in result["results"]) == ["p0", "p1"], result
    teacher_before = versions(await state(ctl, TEACHER))
    assert set(versions(await state(ctl, "")).values()) == {"p-2"} and "p-2" not in teacher_before.values()

    write_checkpoint(tmp_path / "t-3", 3)
    status, accepted = await ctl.call(
        "POST", f"{TEACHER}/v1/rl/update_weights", update_body("t-3", tmp_path / "t-3", wait=False)
    )
    assert status in (200, 202), accepted
    if status == 202:  # the operation is followed under the fleet's own path
        resp = await ctl.client.get(f"{TEACHER}/v1/rl/operations/{accepted['id']}")
        assert resp.status == 200

    async def teacher_updated() -> bool:
        return set(versions(await state(ctl, TEACHER)).values()) == {"t-3"}

    await wait_for(teacher_updated, 20, "the teacher fleet at t-3")
    root, teacher = await state(ctl, ""), await state(ctl, TEACHER)
    assert (root["desired"]["weight_version"], teacher["desired"]["weight_version"]) == ("p-2", "t-3")
    assert set(versions(root).values()) == {"p-2"}  # the teacher's update touched no policy member
    assert teacher["applied"] == {"weight_version": "t-3", "converged": True, "verified": True}

    # Each desired state in its own store, beside the other.
    stored = {p.name: json.loads(p.read_text())["weight_version"] for p in (tmp_path / "state").glob("*.json")}
    assert stored == {"desired.json": "p-2", "desired.teacher.json": "t-3"}
    # Each fleet's operations log holds its own operations.
    _, ops = await ctl.call("GET", f"{TEACHER}/v1/rl/operations", headers={})
    _, root_ops = await ctl.call("GET", "/v1/rl/operations", headers={})
    assert {r["worker_id"] for op in ops["operations"] for r in op["results"]} == {"t0", "t1"}
    assert {r["worker_id"] for op in root_ops["operations"] for r in op["results"]} == {"p0", "p1"}


async def test_the_gateway_routes_by_model_inside_each_fleets_fence(fleet, tmp_path: Path) -> None:
    ctl, gateway = fleet
    async with aiohttp.ClientSession() as http:
        for model, fleet_members in (("policy-m", {"p0", "p1"}), ("teacher-m", {"t0", "t1"})):
            workers = set()
            for _ in range(6):
                status, headers, body = await complete(http, gateway, model)
                assert status == 200, body
                workers.add(headers["X-RL-Worker"])
            assert workers == fleet_members  # both members of that fleet, no other
        status, _, models = await _get(http, gateway + "/v1/models")
        assert status == 200 and {"policy-m", "teacher-m"} <= {m["id"] for m in models["data"]}

        # The teacher fleet paused: its requests are held (then 503 saying why), the policy's go on.
        status, result = await ctl.call("POST", f"{TEACHER}/v1/rl/pause", {"mode": "keep"})
        assert status == 200, result
        status, headers, body = await complete(http, gateway, "policy-m")
        assert status == 200 and headers["X-RL-Worker"] in {"p0", "p1"}
        status, _, body = await complete(http, gateway, "teacher-m", **{"X-RL-Hold-Timeout": "0.3"})
        assert status == 503 and "paused" in body["error"]["message"], body
        assert (await state(ctl, ""))["pause_state"] == "running"
        status, result = await ctl.call("POST", f"{TEACHER}/v1/rl/resume", {})
        assert status == 200, result

        # A teacher update moves only the teacher's fence.
        policy_version = (await complete(http, gateway, "policy-m"))[1]["X-RL-Weight-Version"]
        write_checkpoint(tmp_path / "t-2", 2)
        status, result = await ctl.call("POST", f"{TEACHER}/v1/rl/update_weights", update_body("t-2", tmp_path / "t-2"))
        assert status == 200, result
        status, headers, _ = await complete(http, gateway, "teacher-m")
        assert status == 200 and headers["X-RL-Weight-Version"] == "t-2"
        status, headers, _ = await complete(http, gateway, "policy-m")
        assert status == 200 and headers["X-RL-Weight-Version"] == policy_version
    # Each fleet's state shows the gateway's view of its own members only.
    assert {w["worker_id"] for w in (await state(ctl, ""))["gateway"]["workers"]} == {"p0", "p1"}
    assert {w["worker_id"] for w in (await state(ctl, TEACHER))["gateway"]["workers"]} == {"t0", "t1"}


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any, Any]:
    async with http.get(url) as resp:
        return resp.status, resp.headers, await resp.json()


async def test_a_standalone_gateway_follows_every_fleet_and_routes_by_model(fleet, tmp_path: Path) -> None:
    """What the chart runs as N replicas: given the controller's `fleets`, a standalone gateway
    follows each fleet's state at its path and routes by model inside each fence."""
    ctl, _ = fleet
    gateway = GatewayProcess(
        {
            "log_level": "warning",
            "fleets": {"teacher": {"selector": "role=teacher"}},
            "gateway": {
                "host": "127.0.0.1",
                "port": 0,
                "follow_url": ctl.url,
                "follow_token": CTL_TOKEN,
                "follow_interval_s": 0.1,
                "hold_timeout_s": 5,
            },
        },
        tmp_path,
    )
    await gateway.spawn().wait_ready_async()
    try:
        async with aiohttp.ClientSession() as http:

            async def routes_both() -> bool:
                answers = [await complete(http, gateway.url, m) for m in ("policy-m", "teacher-m")]
                return [a[0] for a in answers] == [200, 200]

            await wait_for(routes_both, 15, "the standalone gateway serving both fleets")
            for model, members in (("policy-m", {"p0", "p1"}), ("teacher-m", {"t0", "t1"})):
                for _ in range(4):
                    status, headers, body = await complete(http, gateway.url, model)
                    assert status == 200 and headers["X-RL-Worker"] in members, (model, body)
            status, result = await ctl.call("POST", f"{TEACHER}/v1/rl/pause", {"mode": "keep"})
            assert status == 200, result

            async def teacher_held() -> bool:
                # A request the gateway forwarded before it read the pause waits in the paused member
                # (mode keep) until resume, as it should: the probe gives up on it and asks again.
                try:
                    async with asyncio.timeout(2):
                        status, _, _ = await complete(http, gateway.url, "teacher-m", **{"X-RL-Hold-Timeout": "0.2"})
                except TimeoutError:
                    return False
                return status == 503

            await wait_for(teacher_held, 10, "the teacher's requests held by the standalone gateway")
            status, headers, _ = await complete(http, gateway.url, "policy-m")
            assert status == 200 and headers["X-RL-Worker"] in {"p0", "p1"}
            status, result = await ctl.call("POST", f"{TEACHER}/v1/rl/resume", {})
            assert status == 200, result
    finally:
        gateway.stop()


async def test_a_fleets_base_url_takes_the_vllm_shaped_facade(fleet, tmp_path: Path) -> None:
    """What a trainer written for one vLLM server sends, pointed at a fleet's base URL."""
    ctl, _ = fleet
    status, body = await ctl.call("POST", f"{TEACHER}/pause?mode=keep")
    assert status == 200, body
    assert (await ctl.call("GET", f"{TEACHER}/is_paused", headers={}))[1] == {"is_paused": True}
    assert (await ctl.call("GET", "/is_paused", headers={}))[1] == {"is_paused": False}
    status, body = await ctl.call("POST", f"{TEACHER}/resume")
    assert status == 200, body
    write_checkpoint(tmp_path / "t-4", 3)
    status, body = await ctl.call("POST", f"{TEACHER}/update_weights", {"weight_dir": str(tmp_path / "t-4")})
    assert status == 200, body
    assert (await ctl.call("GET", f"{TEACHER}/weight_info", headers={}))[1] == {"weight_version": "t-4"}
    assert (await ctl.call("GET", "/weight_info", headers={}))[1] != {"weight_version": "t-4"}
    status, body = await ctl.call("GET", "/fleets/nope/v1/rl/state", headers={})
    assert status == 404
    status, document = await ctl.call("GET", f"{TEACHER}/openapi.json", headers={})
    assert status == 200 and document["servers"] == [{"url": TEACHER}] and "/v1/rl/fleets" not in document["paths"]


async def test_rlctl_lists_the_fleets_and_steers_one_by_name(fleet) -> None:
    ctl, _ = fleet
    rc, out, err = await rlctl(ctl.url, "fleets")
    assert rc == 0, err
    assert "default" in out and "teacher" in out and "role=teacher" in out and "teacher-m" in out
    rc, out, err = await rlctl(ctl.url, "--fleet", "teacher", "-o", "json", "state")
    assert rc == 0, err
    assert sorted(w["id"] for w in json.loads(out)["workers"]) == ["t0", "t1"]
    rc, out, err = await rlctl(ctl.url, "--fleet", "teacher", "pause")
    assert rc == 0, err
    assert (await state(ctl, TEACHER))["pause_state"] == "paused"
    assert (await state(ctl, ""))["pause_state"] == "running"
    rc, out, err = await rlctl(ctl.url, "--fleet", "teacher", "state")
    assert rc == 0 and "fleet teacher: 2 workers" in out, out
    rc, out, err = await rlctl(ctl.url, "--fleet", "teacher", "resume")
    assert rc == 0, err
    rc, out, err = await rlctl(ctl.url, "--fleet", "nope", "state")
    assert rc == 2 and "no fleet 'nope'" in err and "teacher (at /fleets/teacher)" in err, (out, err)


async def test_a_model_no_fleet_serves_is_a_404_naming_model_when_the_default_fleet_is_empty(tmp_path: Path) -> None:
    ctl, agents = await start(
        tmp_path,
        {"policy": {"selector": "role=policy", "models": ["policy-alias"]}, "teacher": {"selector": "role=teacher"}},
    )
    try:
        await wait_for(lambda: serving(ctl, "/fleets/policy"), 10, "the policy fleet serving")
        assert (await state(ctl, ""))["workers"] == []
        gateway = ctl.client.server.app[GATEWAY].url
        async with aiohttp.ClientSession() as http:
            status, _, body = await complete(http, gateway, "nope")
            assert status == 404 and body["error"]["field"] == "model", body
            assert "policy: policy-alias, policy-m" in body["error"]["message"]
            status, headers, body = await complete(http, gateway, "policy-m")
            assert status == 200 and headers["X-RL-Worker"] in {"p0", "p1"}, body
            # A name from the fleet's settings routes there too (the sim worker itself then
            # refuses a model it does not serve: its 404, passed on).
            status, headers, body = await complete(http, gateway, "policy-alias")
            assert status == 404 and headers["X-RL-Worker"] in {"p0", "p1"}, body
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()


async def test_the_daemon_serves_each_fleet_through_its_front_and_keeps_each_desired_state_over_a_restart(
    tmp_path: Path,
) -> None:
    """The controller as it is deployed: a process with its front; a named fleet's routes pass
    the front like the root's, and each fleet's desired state outlives the process on its own."""
    agents = [await SimAgent(wid, [tmp_path], model=model).start() for wid, model in MODELS.items()]
    config = controller_config(
        tmp_path,
        [Labelled(a, {"role": ROLE[a.model]}).spec() for a in agents],
        [tmp_path],
        fleets={"teacher": {"selector": "role=teacher"}},
    )
    ctl = ControllerProcess(config, tmp_path)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

            async def read(path: str) -> dict[str, Any]:
                async with http.get(ctl.url + path, headers=AUTH) as resp:
                    assert resp.status == 200, await resp.text()
                    return await resp.json()

            for attempt in range(2):
                await ctl.spawn().wait_ready_async()
                await wait_reachable(http, ctl.url, workers=2, timeout_s=30)
                await wait_reachable(http, ctl.url + TEACHER, workers=2, timeout_s=30)
                if attempt == 0:
                    async with http.post(
                        ctl.url + f"{TEACHER}/v1/rl/pause", json={"mode": "keep"}, headers=AUTH
                    ) as resp:
                        assert resp.status == 200, await resp.text()
                    ctl.stop()
            root, teacher = await read("/v1/rl/state"), await read(f"{TEACHER}/v1/rl/state")
            # After the restart: the teacher still desired paused (its own file), the policy not.
            assert (root["desired"]["paused"], teacher["desired"]["paused"]) == (False, True)
            assert (root["pause_state"], teacher["pause_state"]) == ("running", "paused")
            assert [a.service.paused for a in agents] == [False, False, True, True]
            listing = await read("/v1/rl/fleets")
            assert [(f["name"], f["pause_state"]) for f in listing["fleets"]] == [
                ("default", "running"),
                ("teacher", "paused"),
            ]
    finally:
        ctl.stop()
        for a in agents:
            await a.stop()


# -- membership split, without sockets --------------------------------------------------------------
def spec(worker_id: str, **labels: str) -> WorkerSpec:
    return WorkerSpec(id=worker_id, admin_url=f"http://{worker_id}", labels=labels)


def test_a_member_goes_to_the_first_fleet_whose_selector_matches_else_to_the_default() -> None:
    selectors = {"teacher": parse_selector("role=teacher"), "any-a": parse_selector("zone=a")}
    shares = partition(
        [spec("a", role="teacher", zone="a"), spec("b", zone="a"), spec("c", role="policy"), spec("d")], selectors
    )
    assert {name: [s.id for s in specs] for name, specs in shares.items()} == {
        "teacher": ["a"],
        "any-a": ["b"],
        "default": ["c", "d"],
    }
    assert partition([], selectors) == {"teacher": [], "any-a": [], "default": []}


async def test_a_relabelled_member_leaves_one_fleet_for_the_other(tmp_path: Path) -> None:
    memory = await MemoryFleet.start(2, roots=[tmp_path])
    try:
        settings = ControllerSettings(
            store={"kind": "memory"}, gateway={"enabled": False}, fleets={"teacher": {"selector": "role=teacher"}}
        )

        def make(name: str) -> Controller:
            return Controller(settings, transports=memory.transport, store=MemoryStore(), fleet=name)

        fleets = Fleets(make("default"), {"teacher": make("teacher")})
        w0, w1 = memory.specs()
        teacher_w0 = w0.model_copy(update={"labels": {"role": "teacher"}})
        fleets.apply_membership([teacher_w0, w1])
        assert ([r.id for r in fleets.default.members()], [r.id for r in fleets.named["teacher"].members()]) == (
            ["w1"],
            ["w0"],
        )
        fleets.apply_membership([w0, w1.model_copy(update={"labels": {"role": "teacher"}})])
        assert ([r.id for r in fleets.default.members()], [r.id for r in fleets.named["teacher"].members()]) == (
            ["w0"],
            ["w1"],
        )
    finally:
        await memory.stop()


@pytest.mark.parametrize(
    "fleets, says",
    [
        ({"default": {"selector": "a=b"}}, "'default' is not a fleet name"),
        ({"Teacher": {"selector": "a=b"}}, "'Teacher' is not a fleet name"),
        ({"a_b": {"selector": "a=b"}}, "'a_b' is not a fleet name"),
        ({"teacher": {"selector": "role in (a"}}, "selector"),
        ({"teacher": {}}, "selector"),
    ],
)
def test_fleet_settings_refuse_bad_names_and_selectors(fleets: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says.replace("(", r"\(")):
        ControllerSettings(fleets=fleets)

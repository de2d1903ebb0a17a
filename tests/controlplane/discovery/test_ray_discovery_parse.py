"""Ray discovery's pure parts on answers a real Ray 2.60.0 dashboard gave
(`tests/controlplane/discovery/data/ray_actors.json`, captured with rlcp/harness/raycluster.py), and the poller's
failure handling against a real aiohttp server on 127.0.0.1 serving those answers. The
whole path over a live Ray head is tests/controlplane/discovery/test_ray_discovery.py."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from rlcp.controlplane.discovery.base import Membership
from rlcp.controlplane.discovery.factory import make_source
from rlcp.controlplane.discovery.ray import RayActorSource, RayStateError, parse_actors, query
from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.fleet.members import NEVER_TOLD, FleetRegistry
from rlcp.controlplane.settings import ControllerSettings

ANSWERS = json.loads((Path(__file__).parent / "data" / "ray_actors.json").read_text())
NAMED, UNNAMED = "rlcp-agent-0", "b01375f69c4a36c883370c7201000000"


def actors(answer: dict) -> list[dict]:
    return answer["data"]["result"]["result"]


def with_actors(entries: list[Any]) -> dict:
    answer = copy.deepcopy(ANSWERS["alive"])
    answer["data"]["result"]["result"] = entries
    answer["data"]["result"].update(total=len(entries), num_after_truncation=len(entries), num_filtered=len(entries))
    return answer


def test_alive_actors_become_members_named_or_by_actor_id() -> None:
    found = parse_actors(ANSWERS["alive"], namespace="rl")
    by_id = {s.id: s for s in found.specs}
    assert set(by_id) == {NAMED, UNNAMED}
    a = by_id[NAMED]
    assert (a.admin_url, a.inference_url, a.flavor, a.world_size, a.model, a.incarnation) == (
        "http://127.0.0.1:1111",
        "http://127.0.0.1:1112",
        "agent",
        1,
        "sim",
        "0",
    )
    assert by_id[UNNAMED].inference_url is None
    assert found.skipped == [] and set(found.states.values()) == {"ALIVE"}


def test_without_a_namespace_a_name_is_qualified_by_it() -> None:
    ids = {s.id for s in parse_actors(ANSWERS["alive"]).specs}
    assert ids == {f"rl/{NAMED}", UNNAMED}


def test_a_restart_keeps_the_member_and_changes_its_incarnation() -> None:
    m = Membership()
    m.apply(parse_actors(ANSWERS["alive"], namespace="rl").specs)
    restarting = parse_actors(ANSWERS["restarting"], namespace="rl")
    assert restarting.states[NAMED] == "RESTARTING"  # still a member: it reads as unreachable
    change = m.apply(restarting.specs)
    assert change is not None and [s.id for s in change.changed] == [NAMED] and not change.removed
    assert change.changed[0].incarnation == "1"
    # ALIVE again on a new pid, same description, same restart count: nothing new to converge
    assert m.apply(parse_actors(ANSWERS["restarted"], namespace="rl").specs) is None


def test_a_restart_starts_the_members_record_afresh_so_it_is_converged_again() -> None:
    registry = FleetRegistry(
        make_driver=lambda spec: object(),  # type: ignore[arg-type,return-value]
        changes=ChangeCounter(),
    )
    registry.apply(parse_actors(ANSWERS["alive"], namespace="rl").specs)
    before = registry.get(NAMED)
    assert before is not None
    before.reachable, before.told_desired = True, "v1"
    registry.apply(parse_actors(ANSWERS["restarting"], namespace="rl").specs)
    after = registry.get(NAMED)
    assert after is not None and after is not before
    assert not after.reachable and after.told_desired is NEVER_TOLD  # read again, told again
    assert registry.get(UNNAMED) is not None and registry.get(UNNAMED).spec.incarnation == "0"


def test_a_dead_actor_stays_a_member_unless_asked_to_drop_it() -> None:
    kept = parse_actors(ANSWERS["dead"], namespace="rl")
    assert {s.id for s in kept.specs} == {NAMED, UNNAMED} and kept.states[UNNAMED] == "DEAD"
    dropped = parse_actors(ANSWERS["dead"], namespace="rl", dead_actors="drop")
    assert [s.id for s in dropped.specs] == [NAMED]
    assert [s.reason for s in dropped.skipped] == ["DEAD (discovery.ray.dead_actors: drop)"]


def test_filters_by_namespace_prefix_and_class() -> None:
    assert parse_actors(ANSWERS["alive"], namespace="other").specs == []
    assert [s.id for s in parse_actors(ANSWERS["alive"], namespace="rl", name_prefix="rlcp-").specs] == [NAMED]
    assert parse_actors(ANSWERS["alive"], namespace="rl", class_name="Trainer").specs == []
    assert len(parse_actors(ANSWERS["alive"], namespace="rl", class_name="Engine").specs) == 2


def test_bad_actors_are_skipped_with_a_reason_and_the_rest_kept() -> None:
    good = actors(ANSWERS["alive"])[0]

    def bad(**kw: Any) -> dict:
        return {**good, "actor_id": kw.pop("actor_id", "x" * 8), "name": kw.pop("name", ""), **kw}

    entries = [
        good,
        "not an object",
        bad(actor_id="a0", repr_name=""),  # a class without a __repr__ of its own (verl's)
        bad(actor_id="a1", repr_name="", state="PENDING_CREATION"),  # not created yet
        bad(actor_id="a2", repr_name="Engine(pid=4)"),  # a framework's actor: not ours
        bad(actor_id="a3", repr_name=json.dumps({"rlcp": 2, "admin_url": "http://x"})),
        bad(actor_id="a4", repr_name=json.dumps({"rlcp": True, "admin_url": "http://x"})),
        bad(actor_id="a5", repr_name=json.dumps({"rlcp": 1})),
        bad(actor_id="a6", repr_name=json.dumps({"rlcp": 1, "admin_url": "http://x", "flavor": "tgi"})),
        bad(actor_id="a7", repr_name=json.dumps({"rlcp": 1, "admin_url": "http://x", "world_size": 0})),
        bad(actor_id="a8", repr_name=json.dumps({"rlcp": 1, "admin_url": "http://x", "routes": [1]})),
        bad(name=NAMED, actor_id="dup"),
    ]  # a second live actor under one name
    found = parse_actors(with_actors(entries), namespace="rl")
    assert [s.id for s in found.specs] == [NAMED]
    reasons = {s.actor_id: s.reason for s in found.skipped}
    assert "no __repr__ of its own" in reasons["a0"]
    assert "no description yet (state PENDING_CREATION" in reasons["a1"]
    assert "not a JSON object" in reasons["a2"]
    assert '"rlcp": 1' in reasons["a3"] and '"rlcp": 1' in reasons["a4"]
    assert "no admin_url" in reasons["a5"]
    assert "unknown flavor 'tgi'" in reasons["a6"]
    assert "world_size" in reasons["a7"]
    assert "routes" in reasons["a8"]
    assert "duplicate member id" in reasons["dup"]
    assert len(found.skipped) == 11


def test_a_name_taken_again_after_its_actor_died_is_the_live_actor() -> None:
    dead = {**actors(ANSWERS["dead"])[1], "name": "w", "state": "DEAD"}
    live = {**actors(ANSWERS["alive"])[0], "name": "w", "actor_id": "new"}
    for order in ([dead, live], [live, dead]):
        found = parse_actors(with_actors(order), namespace="rl")
        assert [(s.id, s.admin_url) for s in found.specs] == [("w", "http://127.0.0.1:1111")]
        assert found.states == {"w": "ALIVE"} and found.skipped == []


@pytest.mark.parametrize(
    "body",
    [
        [],
        "x",
        {"result": False, "msg": "Failed to query"},
        {"result": True, "data": {}},
        {"result": True, "data": {"result": {"result": "no"}}},
    ],
)
def test_a_malformed_answer_is_a_failed_poll(body: Any) -> None:
    with pytest.raises(RayStateError):
        parse_actors(body)


def test_a_truncated_answer_is_a_failed_poll_not_a_partial_list() -> None:
    answer = copy.deepcopy(ANSWERS["alive"])
    answer["data"]["result"].update(total=5000, num_after_truncation=100)
    with pytest.raises(RayStateError, match="read 100 of 5000"):
        parse_actors(answer)
    # the dashboard's own cut at `limit`: Ray 2.60.0 with limit=2 over 8 actors answered
    # total=8, num_after_truncation=8, num_filtered=8 and two actors
    answer = copy.deepcopy(ANSWERS["alive"])
    answer["data"]["result"].update(total=8, num_after_truncation=8, num_filtered=8)
    with pytest.raises(RayStateError, match="returned 2 of 8 matching"):
        parse_actors(answer)


def test_query_filters_on_the_server_where_it_can() -> None:
    assert query(namespace=None, class_name=None, limit=7) == [("detail", "true"), ("limit", "7")]
    q = query(namespace="rl", class_name="Engine", limit=10)
    assert q[2:] == [
        ("filter_keys", "ray_namespace"),
        ("filter_predicates", "="),
        ("filter_values", "rl"),
        ("filter_keys", "class_name"),
        ("filter_predicates", "="),
        ("filter_values", "Engine"),
    ]


def test_settings_require_the_ray_section_and_the_factory_builds_the_source() -> None:
    with pytest.raises(ValueError, match="discovery.ray"):
        ControllerSettings(discovery={"kind": "ray"})
    s = ControllerSettings(
        discovery={"kind": "ray", "ray": {"dashboard_url": "http://127.0.0.1:8265", "namespace": "rl", "token": "t"}}
    )
    src = make_source(s, session=None)  # type: ignore[arg-type]
    assert isinstance(src, RayActorSource) and src.name == "ray"
    with pytest.raises(ValueError):
        ControllerSettings(discovery={"kind": "ray", "ray": {"dashboard_url": "x", "limit": 0}})


# -- the poller, against a real server on loopback -----------------------------------------


class Dashboard:
    def __init__(self) -> None:
        self.answer: Any = ANSWERS["alive"]
        self.statuses: list[int] = []  # one per request, then 200
        self.seen: list[web.Request] = []

    async def actors(self, request: web.Request) -> web.Response:
        self.seen.append(request)
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response(self.answer) if status == 200 else web.Response(status=status)


@pytest.fixture
async def dashboard() -> AsyncIterator[tuple[Dashboard, TestServer]]:
    d = Dashboard()
    app = web.Application()
    app.router.add_get("/api/v0/actors", d.actors)
    async with TestServer(app, host="127.0.0.1") as server:
        yield d, server


async def test_failed_polls_yield_nothing_and_recover(dashboard: tuple[Dashboard, TestServer]) -> None:
    d, server = dashboard
    d.statuses = [200, 500, 503]
    async with aiohttp.ClientSession() as session:
        src = RayActorSource(
            session=session,
            dashboard_url=str(server.make_url("/")),
            namespace="rl",
            interval_s=0.01,
            max_backoff_s=0.02,
            token="tok",
            iterations=4,
        )
        with capture_logs() as logs:
            got = [sorted(s.id for s in specs) async for specs in src.watch()]
    assert got == [sorted([NAMED, UNNAMED])] * 2  # polls 2 and 3 handed on nothing
    assert [e["event"] for e in logs if e["event"].startswith("ray_poll")] == [
        "ray_poll_failed",
        "ray_poll_failed",
        "ray_poll_recovered",
    ]
    assert d.seen[0].headers["Authorization"] == "Bearer tok"
    assert d.seen[0].query.getall("filter_values") == ["rl"] and d.seen[0].query["detail"] == "true"


async def test_down_members_and_skips_are_logged_once(dashboard: tuple[Dashboard, TestServer]) -> None:
    d, server = dashboard
    d.answer = with_actors(
        [
            *actors(ANSWERS["dead"]),
            {**actors(ANSWERS["alive"])[0], "actor_id": "z", "name": "other", "repr_name": "Engine()"},
        ]
    )
    async with aiohttp.ClientSession() as session:
        src = RayActorSource(
            session=session, dashboard_url=str(server.make_url("")), namespace="rl", interval_s=0.01, iterations=3
        )
        with capture_logs() as logs:
            lists = [specs async for specs in src.watch()]
    assert len(lists) == 3 and all(len(x) == 2 for x in lists)
    events = [(e["event"], e.get("worker_id") or e.get("name")) for e in logs]
    assert events == [("ray_actor_skipped", "other"), ("ray_actor_down", UNNAMED)]


async def test_unreachable_dashboard_is_a_failed_poll() -> None:
    async with aiohttp.ClientSession() as session:
        src = RayActorSource(session=session, dashboard_url="http://127.0.0.1:1", timeout_s=2)
        with pytest.raises(RayStateError):
            await src.poll()


def test_an_actors_description_gives_its_labels_and_a_bad_one_skips_it() -> None:
    good = actors(ANSWERS["alive"])[0]
    described = json.loads(good["repr_name"])

    def actor(actor_id: str, name: str, labels: Any) -> dict:
        return {**good, "actor_id": actor_id, "name": name, "repr_name": json.dumps({**described, "labels": labels})}

    found = parse_actors(
        with_actors(
            [
                actor("a0", "policy-0", {"role": "policy"}),
                actor("a1", "plain", None),
                actor("a2", "bad", {"role": "not ok"}),
                actor("a3", "worse", "role=x"),
            ]
        ),
        namespace="rl",
    )
    assert {s.id: dict(s.labels) for s in found.specs} == {"policy-0": {"role": "policy"}, "plain": {}}
    reasons = {s.actor_id: s.reason for s in found.skipped}
    assert "labels in __repr__: label value 'not ok'" in reasons["a2"] and "not an object" in reasons["a3"]

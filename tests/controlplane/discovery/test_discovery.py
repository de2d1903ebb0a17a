"""Discovery sources: the static list, the listing parser/renderer, and the HTTP poller
against a real aiohttp server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from rlcp.controlplane.discovery.base import Membership
from rlcp.controlplane.discovery.http_listing import (
    HttpListingSource,
    ListingError,
    parse_listing,
    render_listing,
)
from rlcp.controlplane.discovery.polling import backoff_s
from rlcp.controlplane.discovery.sglang_router import parse_router_workers
from rlcp.controlplane.discovery.static import StaticSource
from rlcp.controlplane.settings.discovery import HttpListingSettings
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.waiting import LoopStalls


def spec(i: str, **kw: Any) -> WorkerSpec:
    return WorkerSpec(id=i, admin_url=f"http://{i}:9000", **kw)


# -- static -------------------------------------------------------------------------------


async def test_static_yields_once_then_waits_until_cancelled() -> None:
    workers = [spec("a"), spec("b")]
    gen = StaticSource(workers).watch()
    first = await anext(gen)
    assert first == workers
    first.clear()  # the source hands out a copy: the consumer cannot corrupt it
    pending = asyncio.create_task(anext(gen))
    await asyncio.sleep(0.05)
    assert not pending.done(), "a static source must not yield again nor end"
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert await anext(StaticSource(workers).watch()) == workers


async def test_static_membership_syncs_at_epoch_one() -> None:
    change = Membership().apply(await anext(StaticSource([spec("a")]).watch()))
    assert change is not None and change.epoch == 1 and [s.id for s in change.added] == ["a"]


def test_static_rejects_duplicate_ids_naming_the_id() -> None:
    with pytest.raises(ValueError, match="'w-1'"):
        StaticSource([spec("w-0"), spec("w-1"), spec("w-1", world_size=2)])


# -- parse / render -----------------------------------------------------------------------

# What a Dynamo frontend serves: integer instance ids, only the system port, engine routes.
DYNAMO_DOC: dict[str, Any] = {
    "protocol_version": 1,
    "namespace": "dynamo",
    "workers": [
        {
            "instance_id": 7587888155734553601,
            "namespace": "dynamo",
            "component": "backend",
            "endpoint": "generate",
            "system_url": "http://10.0.1.12:9090",
            "admin_base_url": "http://10.0.1.12:9090/engine",
            "model": "Qwen/Qwen3-0.6B",
            "routes": ["pause_generation", "resume_generation", "update_weights_from_disk"],
            "world_size": 2,
        },
        {
            "instance_id": "694d9a2b1c",
            "component": "backend",
            "system_url": "http://10.0.1.13:9090",
            "routes": ["pause_generation", "resume_generation"],
        },
    ],
}


def test_parse_dynamo_listing() -> None:
    specs = parse_listing(DYNAMO_DOC, default_flavor="dynamo")
    assert specs == [
        WorkerSpec(
            id="7587888155734553601",
            admin_url="http://10.0.1.12:9090/engine",
            flavor="dynamo",
            world_size=2,
            model="Qwen/Qwen3-0.6B",
            routes=("pause_generation", "resume_generation", "update_weights_from_disk"),
        ),
        WorkerSpec(
            id="694d9a2b1c",
            admin_url="http://10.0.1.13:9090",
            flavor="dynamo",
            world_size=1,
            routes=("pause_generation", "resume_generation"),
        ),
    ]
    assert {s.flavor for s in parse_listing(DYNAMO_DOC, default_flavor="vllm")} == {"vllm"}


def test_dynamo_entries_take_inference_at_the_frontend_given() -> None:
    # Dynamo's listing names no inference URL (its workers have none of their own); the
    # configured frontend is every such entry's, and an entry that names one keeps it.
    frontend = "http://10.0.1.2:8000"
    specs = parse_listing(DYNAMO_DOC, default_flavor="dynamo", inference_url=frontend)
    assert [s.inference_url for s in specs] == [frontend, frontend]
    doc = {
        "protocol_version": 1,
        "workers": [{"instance_id": "a", "system_url": "http://h:1", "inference_url": "http://h:8000"}],
    }
    assert parse_listing(doc, default_flavor="dynamo", inference_url=frontend)[0].inference_url == "http://h:8000"
    assert {s.inference_url for s in parse_listing(DYNAMO_DOC, default_flavor="dynamo")} == {None}


def test_parse_this_projects_fields_take_precedence() -> None:
    doc = {
        "protocol_version": 1,
        "namespace": "rl",
        "workers": [
            {
                "instance_id": "agent-0",
                "system_url": "http://h:1",
                "admin_base_url": "http://h:2",
                "admin_url": "http://h:3",
                "inference_url": "http://h:8000",
                "flavor": "agent",
                "world_size": 4,
                "model": "m",
                "serving": True,
                "ready": True,
                "weight_version": "v7",
            },
        ],
        "membership_epoch": 3,
    }
    assert parse_listing(doc, default_flavor="dynamo") == [
        WorkerSpec(
            id="agent-0", admin_url="http://h:3", inference_url="http://h:8000", flavor="agent", world_size=4, model="m"
        )
    ]


def test_parse_skips_bad_entries_and_keeps_the_rest() -> None:
    good = {"instance_id": "ok", "system_url": "http://ok:1"}
    doc = {
        "protocol_version": 1,
        "namespace": "n",
        "workers": [
            {"system_url": "http://no-id:1"},
            {"instance_id": "", "system_url": "http://empty-id:1"},
            {"instance_id": True, "system_url": "http://bool-id:1"},
            {"instance_id": "no-url"},
            {"instance_id": "bad-flavor", "system_url": "http://x:1", "flavor": "tgi"},
            {"instance_id": "bad-size", "system_url": "http://x:1", "world_size": -2},
            "not-an-object",
            good,
            {"instance_id": "ok", "system_url": "http://dup:1"},
        ],
    }
    with capture_logs() as logs:
        specs = parse_listing(doc, default_flavor="dynamo")
    assert specs == [WorkerSpec(id="ok", admin_url="http://ok:1", flavor="dynamo")]
    skipped = [e for e in logs if e["event"] == "listing_entry_skipped"]
    assert len(skipped) == 8 and all(e["log_level"] == "warning" for e in skipped)
    by_index = {e["index"]: e for e in skipped}
    assert "tgi" in by_index[4]["reason"] and by_index[4]["entry"]["instance_id"] == "bad-flavor"
    assert "no instance_id" in by_index[0]["reason"]
    assert "admin_url" in by_index[3]["reason"]
    assert "world_size" in by_index[5]["reason"]
    assert "duplicate" in by_index[8]["reason"]


@pytest.mark.parametrize(
    "body",
    [
        [],
        "workers",
        None,
        {"namespace": "n", "workers": []},
        {"protocol_version": 2, "namespace": "n", "workers": []},
        {"protocol_version": True, "namespace": "n", "workers": []},
        {"protocol_version": 1, "namespace": "n"},
        {"protocol_version": 1, "namespace": "n", "workers": {"a": {}}},
    ],
)
def test_parse_rejects_a_malformed_top_level(body: Any) -> None:
    with pytest.raises(ListingError):
        parse_listing(body, default_flavor="dynamo")


def test_render_then_parse_round_trips() -> None:
    specs = [
        spec("a", flavor="agent", inference_url="http://a:8000", world_size=2, model="tiny"),
        spec("v", flavor="vllm"),
        spec("d", flavor="dynamo", world_size=8, model="big"),
    ]
    doc = json.loads(json.dumps(render_listing(specs, namespace="rl", serving={"a": True, "v": False})))
    assert doc["protocol_version"] == 1 and doc["namespace"] == "rl"
    a, v, d = doc["workers"]
    assert a["system_url"] == a["admin_url"] == "http://a:9000" and a["instance_id"] == "a"
    assert {"pause", "resume", "update_weights", "load_lora"} <= set(a["routes"])
    assert (a["serving"], v["serving"], d["serving"]) == (True, False, False)  # unknown = not serving
    # Without capabilities, a member is listed with everything its flavor can do; a dynamo
    # member with Dynamo's own route names, so a reader narrows capabilities the same way.
    assert {"pause_generation", "update_weights_from_disk", "load_lora", "get_weight_version"} <= set(d["routes"])
    assert "update_weights" not in d["routes"]
    # A default flavor none of them uses proves the flavor travels in the document.
    unrouted = [s.model_copy(update={"routes": None}) for s in parse_listing(doc, default_flavor="vllm")]
    assert unrouted == specs
    assert [s.flavor for s in parse_listing(doc, default_flavor="agent")] == ["agent", "vllm", "dynamo"]
    assert "serving" not in render_listing(specs, namespace="rl")["workers"][0]


# -- backoff ------------------------------------------------------------------------------


def test_backoff_grows_is_capped_and_never_undercuts_the_interval() -> None:
    for failures in range(1, 200):
        delay = backoff_s(failures, interval_s=1.0, max_backoff_s=30.0)
        ceiling = min(30.0, 2.0 ** min(failures, 32))
        assert max(1.0, ceiling / 2) <= delay <= ceiling
    assert backoff_s(5, interval_s=10.0, max_backoff_s=1.0) == 10.0
    assert len({backoff_s(6, interval_s=1.0, max_backoff_s=1000.0) for _ in range(20)}) > 1  # jittered


# -- the poller against a real server -----------------------------------------------------


def listing(*workers: dict[str, Any]) -> dict[str, Any]:
    return {"protocol_version": 1, "namespace": "test", "workers": list(workers)}


def entry(i: str, **kw: Any) -> dict[str, Any]:
    return {"instance_id": i, "system_url": f"http://{i}:9090", **kw}


@dataclass
class Listing:
    """What the fake frontend answers; tests mutate it between polls. `script` is
    consumed first, one reply per request (a status code, "hang", or a document)."""

    doc: Any = field(default_factory=lambda: listing())
    script: list[Any] = field(default_factory=list)
    seen_auth: list[str | None] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen_auth.append(request.headers.get("Authorization"))
        reply = self.script.pop(0) if self.script else self.doc
        if reply == "hang":
            await self.release.wait()  # until teardown: the client must give up first
        if isinstance(reply, int):
            return web.json_response({"error": {"code": "boom", "message": "boom"}}, status=reply)
        if reply == "not-json":
            return web.Response(text="<html>gateway</html>", content_type="text/html")
        return web.json_response(self.doc if reply == "hang" else reply)


@pytest.fixture
async def server() -> AsyncIterator[Listing]:
    state = Listing()
    app = web.Application()
    app.router.add_get("/v1/rl/workers", state.handle)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    state.url = str(srv.make_url("/v1/rl/workers"))
    yield state
    state.release.set()
    await srv.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def source(session: aiohttp.ClientSession, url: str, **kw: Any) -> HttpListingSource:
    kw.setdefault("interval_s", 0.01)
    kw.setdefault("max_backoff_s", 0.05)
    return HttpListingSource(session=session, url=url, **kw)


async def test_membership_follows_the_listing_and_epoch_moves_only_on_change(
    server: Listing, session: aiohttp.ClientSession
) -> None:
    membership = Membership()
    gen = source(session, server.url).watch()
    server.doc = listing(entry("a"), entry("b"))
    first = membership.apply(await anext(gen))
    assert first is not None and first.epoch == 1 and {s.id for s in first.added} == {"a", "b"}

    assert membership.apply(await anext(gen)) is None  # unchanged poll: no new epoch

    server.doc = listing(entry("a"), entry("b"), entry("c", flavor="agent"))
    change = membership.apply(await anext(gen))
    assert change is not None and change.epoch == 2 and [s.id for s in change.added] == ["c"]
    assert membership.workers["c"].flavor == "agent"

    server.doc = listing(entry("a", world_size=4))
    change = membership.apply(await anext(gen))
    assert change is not None and change.epoch == 3
    assert {s.id for s in change.removed} == {"b", "c"} and [s.id for s in change.changed] == ["a"]
    assert membership.workers["a"].world_size == 4 and membership.workers["a"].flavor == "dynamo"
    await gen.aclose()
    assert len(server.seen_auth) == 4


async def test_failed_polls_yield_nothing_and_keep_membership(server: Listing, session: aiohttp.ClientSession) -> None:
    server.doc = listing(entry("a"), entry("b"))
    server.script = [server.doc, 500, 503, "not-json", {"protocol_version": 2, "workers": []}, server.doc, 502]
    membership = Membership()
    yielded = []
    with capture_logs() as logs:
        async for specs in source(session, server.url, iterations=7).watch():
            yielded.append([s.id for s in specs])
            membership.apply(specs)
    assert len(server.seen_auth) == 7  # every poll reached the server
    assert yielded == [["a", "b"], ["a", "b"]]  # only the two good polls yielded
    assert membership.epoch == 1 and set(membership.workers) == {"a", "b"}
    failed = [e for e in logs if e["event"] == "listing_poll_failed"]
    assert [e["failures"] for e in failed] == [1, 2, 3, 4, 1]  # a success resets the count
    assert "500" in failed[0]["reason"] and "503" in failed[1]["reason"]
    assert "JSON" in failed[2]["reason"] and "protocol_version" in failed[3]["reason"]
    assert all(e["log_level"] == "warning" for e in failed)
    assert any(e["event"] == "listing_poll_recovered" for e in logs)


async def test_a_hanging_listing_times_out_as_a_failed_poll(server: Listing, session: aiohttp.ClientSession) -> None:
    server.doc = listing(entry("a"))
    server.script = ["hang"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    # Without a deadline of its own the source would hang here (the outer one only ends the test).
    # The bound leaves out the time the test's own loop could not run (a loaded machine).
    # One poll with the 0.1 s deadline: the one that hangs. A poll answered after it under the same
    # 0.1 s was seen to outlast it on a loaded machine (the fast lane beside CI34).
    with capture_logs() as logs:
        async with LoopStalls() as stalls, asyncio.timeout(30):
            yielded = [s async for s in source(session, server.url, timeout_s=0.1, iterations=1).watch()]
    assert loop.time() - started - stalls.s < 1.0
    assert yielded == []  # a failed poll yields nothing
    failed = [e for e in logs if e["event"] == "listing_poll_failed"]
    assert len(failed) == 1 and "0.1" in failed[0]["reason"]
    # The session the hung request was given up on polls again (its default deadline).
    recovered = [s async for s in source(session, server.url, iterations=1).watch()]
    assert [[s.id for s in specs] for specs in recovered] == [["a"]]


async def test_unreachable_listing_is_a_failed_poll(session: aiohttp.ClientSession) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with capture_logs() as logs:
        yielded = [x async for x in source(session, f"http://127.0.0.1:{port}/v1/rl/workers", iterations=2).watch()]
    assert yielded == []
    assert [e["failures"] for e in logs if e["event"] == "listing_poll_failed"] == [1, 2]


async def test_bearer_token_is_sent_only_when_given(server: Listing, session: aiohttp.ClientSession) -> None:
    [_] = [x async for x in source(session, server.url, token="s3cret", iterations=1).watch()]
    [_] = [x async for x in source(session, server.url, iterations=1).watch()]
    assert server.seen_auth == ["Bearer s3cret", None]


def test_constructor_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        HttpListingSource(session=None, url="http://x", interval_s=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tgi"):
        HttpListingSource(session=None, url="http://x", default_flavor="tgi")  # type: ignore[arg-type]


def test_render_lists_only_what_each_member_can_do() -> None:
    specs = [spec("a", flavor="agent"), spec("d", flavor="dynamo")]
    doc = render_listing(
        specs, namespace="rl", capabilities={"a": frozenset({"control"}), "d": frozenset({"control", "disk_weights"})}
    )
    a, d = doc["workers"]
    assert a["routes"] == ["pause", "resume"]
    assert d["routes"] == [
        "get_weight_version",
        "liveness_probe",
        "pause_generation",
        "resume_generation",
        "update_weights_from_disk",
    ]


def test_parse_skips_an_entry_whose_routes_are_not_strings() -> None:
    doc = {
        "protocol_version": 1,
        "namespace": "rl",
        "workers": [
            {"instance_id": 1, "system_url": "http://h:1", "routes": "pause_generation"},
            {"instance_id": 2, "system_url": "http://h:2", "routes": [1, 2]},
            {"instance_id": 3, "system_url": "http://h:3"},
        ],
    }
    assert [(s.id, s.routes) for s in parse_listing(doc, default_flavor="dynamo")] == [("3", None)]


def test_listing_labels_travel_and_bad_labels_skip_the_entry() -> None:
    specs = [spec("a", labels={"role": "policy"}), spec("b")]
    doc = json.loads(json.dumps(render_listing(specs, namespace="rl")))
    assert [w["labels"] for w in doc["workers"]] == [{"role": "policy"}, {}]
    assert [dict(s.labels) for s in parse_listing(doc, default_flavor="agent")] == [{"role": "policy"}, {}]
    doc["workers"][0]["labels"] = {"role": "not ok"}
    doc["workers"].append({"instance_id": "c", "system_url": "http://c:1", "labels": ["role"]})
    with capture_logs() as logs:
        assert [s.id for s in parse_listing(doc, default_flavor="agent")] == ["b"]
    reasons = [e["reason"] for e in logs if e["event"] == "listing_entry_skipped"]
    assert len(reasons) == 2 and "label value 'not ok'" in reasons[0] and "not an object" in reasons[1]


# -- an sglang-router's worker list (format sglang_router) ---------------------------------


def router_worker(url: Any, **kw: Any) -> dict[str, Any]:
    """An entry as sglang-router 0.3.2 lists it (`GET /workers`, seen against the binary)."""
    return {
        "id": "c886706f-933b-4a70-b024-9d816b22a75a",
        "url": url,
        "model_id": "m",
        "worker_type": "regular",
        "is_healthy": True,
        "metadata": {"model_path": "m", "dp_size": "1", "tp_size": "4"},
        **kw,
    }


def test_router_workers_are_sglang_members_keyed_by_url_and_bad_entries_skipped() -> None:
    body = {
        "workers": [
            router_worker("http://10.0.0.5:30000/"),
            router_worker("http://10.0.0.6:30000", worker_type="decode", is_healthy=False, metadata={}),
            router_worker("grpc://10.0.0.7:30000"),  # no HTTP admin routes to call
            router_worker(None),
            router_worker("http://10.0.0.5:30000", id="another-uuid"),  # the same server twice
            "nonsense",
        ],
        "total": 6,
    }
    with capture_logs() as logs:
        specs = parse_router_workers(body, error=ListingError)
    assert specs == [
        WorkerSpec(
            id="http://10.0.0.5:30000",
            admin_url="http://10.0.0.5:30000",
            inference_url="http://10.0.0.5:30000",
            flavor="sglang",
            world_size=4,
            model="m",
            labels={"worker_type": "regular"},
        ),
        WorkerSpec(
            id="http://10.0.0.6:30000",
            admin_url="http://10.0.0.6:30000",
            inference_url="http://10.0.0.6:30000",
            flavor="sglang",
            model="m",
            labels={"worker_type": "decode"},
        ),  # unhealthy to the router is still a member: the controller reads its status itself
    ]
    assert [e["reason"] for e in logs if e["event"] == "router_worker_skipped"] == [
        "url 'grpc://10.0.0.7:30000' is not an http(s) URL",
        "url None is not an http(s) URL",
        "duplicate url 'http://10.0.0.5:30000'",
        "entry is not an object",
    ]


@pytest.mark.parametrize("body", [[], {"total": 0}, {"workers": {}}, {"protocol_version": 1, "workers": None}])
def test_router_answer_without_a_worker_list_is_a_failed_poll(body: Any) -> None:
    with pytest.raises(ListingError):
        parse_router_workers(body, error=ListingError)


@pytest.mark.parametrize("field", ["default_flavor", "inference_url"])
def test_router_format_refuses_settings_it_would_ignore(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} cannot be set with format sglang_router"):
        HttpListingSettings(url="http://r:30000/workers", format="sglang_router", **{field: "vllm"})

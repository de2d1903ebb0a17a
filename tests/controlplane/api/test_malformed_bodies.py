"""Every malformed body is a 4xx on every process, never a 500: a real controller daemon (its
front and its core, and the gateway the core runs) over agents on SimEngine, and an agent's
admin port directly. Each JSON route of each document gets each case; the answer is the
error shape naming `body` or `Content-Encoding`, no worker is touched, and afterwards the
fleet still serves rollouts at its version.

The cases are what an adversary (or a confused client) sends: nesting far past any real
body, a plain body labelled gzip, a truncated or over-long gzip stream, an unknown coding,
bytes that are not UTF-8, a lone surrogate, NaN, an integer past Python's digit limit, and a
small gzip body that decodes past the size limit."""

from __future__ import annotations

import gzip
import json

import aiohttp
import pytest

from rlcp.agent.admin.openapi import ROUTES as AGENT_ROUTES
from rlcp.controlplane.api.openapi import ROUTES as CONTROLLER_ROUTES
from rlcp.controlplane.gateway.app import ROUTES as GATEWAY_ROUTES
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import AUTH, update_body, wait_reachable
from rlcp.harness.http import bearer
from rlcp.harness.simfleet import TOKEN, SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import FleetShape
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(inference=True)


_OBJECT = b'{"mode": "keep"}'
_BOMB = gzip.compress(b'{"a": "' + b"x" * (8 << 20) + b'"}')  # 8 KiB that decodes to 8 MiB


def cases() -> list[tuple[str, bytes, dict[str, str], int, str]]:
    """(name, body, headers, status, field), as a process that decodes bodies answers them."""
    return [
        ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000, {}, 400, "body"),
        ("nested in a field", b'{"mode": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", {}, 400, "body"),
        ("plain body labelled gzip", _OBJECT, {"Content-Encoding": "gzip"}, 400, "Content-Encoding"),
        ("plain body labelled deflate", _OBJECT, {"Content-Encoding": "deflate"}, 400, "Content-Encoding"),
        ("truncated gzip", gzip.compress(_OBJECT)[:-5], {"Content-Encoding": "gzip"}, 400, "Content-Encoding"),
        (
            "bytes after the gzip stream",
            gzip.compress(_OBJECT) + b"{}",
            {"Content-Encoding": "gzip"},
            400,
            "Content-Encoding",
        ),
        ("brotli", _OBJECT, {"Content-Encoding": "br"}, 415, "Content-Encoding"),
        ("an unknown coding", _OBJECT, {"Content-Encoding": "x-rot13"}, 415, "Content-Encoding"),
        ("gzip bomb", _BOMB, {"Content-Encoding": "gzip"}, 413, "body"),
        ("not UTF-8", b'{"mode": "k\xffeep"}', {}, 400, "body"),
        ("UTF-16", _OBJECT.decode().encode("utf-16"), {}, 400, "body"),
        ("lone surrogate", b'{"\\ud800": "x"}', {}, 422, "body"),
        ("NaN", b'{"timeout_s": NaN}', {}, 400, "body"),
        ("5,000 digits", b'{"timeout_s": ' + b"9" * 5000 + b"}", {}, 400, "body"),
    ]


def body_routes(routes) -> list[tuple[str, str]]:
    return sorted({(r.method, r.path) for r in routes if r.body is not None and "{" not in r.path})


async def send(http: aiohttp.ClientSession, method: str, url: str, data: bytes, headers: dict) -> tuple[int, dict]:
    async with http.request(
        method,
        url,
        data=data,
        headers={"Content-Type": "application/json", **headers},
        timeout=aiohttp.ClientTimeout(total=30),
    ) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if resp.content_type == "application/json" else {"text": text}


async def snapshot(http: aiohttp.ClientSession, agent: SimAgent) -> dict:
    status, st = await send(http, "GET", agent.url + "/v1/agent/state", b"", {})
    assert status == 200, st
    return {k: st[k] for k in ("weight_version", "paused", "loras", "desired_weight_version")} | {
        "operations": [op["id"] for op in st["last_operations"]]
    }


async def rollout(http: aiohttp.ClientSession, gateway_url: str) -> tuple[int, dict]:
    async with http.post(
        gateway_url + "/v1/completions",
        json={"model": "sim", "prompt": "hi", "max_tokens": 2},
        timeout=aiohttp.ClientTimeout(total=30),
    ) as resp:
        return resp.status, dict(resp.headers)


async def test_every_malformed_body_is_a_4xx_on_every_process_and_touches_nothing(daemon_fleet, tmp_path):
    agents, ctl, http = daemon_fleet
    honest = json.dumps(update_body("v1", write_checkpoint(tmp_path / "v1", 1))).encode()
    status, result = await send(
        http, "POST", ctl.url + "/v1/rl/update_weights", gzip.compress(honest), {**AUTH, "Content-Encoding": "gzip"}
    )
    assert status == 200, result  # an honest gzip body goes through the front and the core
    state = await wait_reachable(http, ctl.url, workers=2)
    gateway_url = state["gateway"]["url"]
    await wait_for(lambda: rollout(http, gateway_url), what="the gateway serving")
    agent_before = await snapshot(http, agents[0])
    targets = [(ctl.url, AUTH, r, True) for r in body_routes(CONTROLLER_ROUTES)]
    targets += [(agents[0].url, bearer(TOKEN), r, True) for r in body_routes(AGENT_ROUTES)]
    targets += [(gateway_url, {}, r, False) for r in body_routes(GATEWAY_ROUTES)]
    tried, fivexx = 0, []
    for base, auth, (method, path), decodes in targets:
        for name, data, headers, want, field in cases():
            rid = fresh_request_id("malformed")
            status, resp = await send(http, method, base + path, data, with_request_id(rid, {**auth, **headers}))
            tried += 1
            # No fan-out: nothing carrying this request's id reached a worker (but agent 0, when it
            # was sent to agent 0 directly, refused there).
            assert_no_worker_touched(agents[1:] if base == agents[0].url else agents, rid, (base, path, name))
            if status >= 500:
                fivexx.append((base, path, name, status, resp))
                continue
            if not decodes and "Content-Encoding" in headers:
                # The gateway forwards the body as it came and its workers take identity bodies, so
                # any coding is refused. Its app leaves decoding to aiohttp (gateway/app.py), which
                # may refuse first: a stream it cannot decode is a 400, brotli a plain-text 400.
                assert status in (400, 413, 415), (path, name, status, resp)
                if name != "brotli":
                    assert resp["error"]["field"] in ("Content-Encoding", "body"), (path, name, resp)
                continue
            assert (status, resp["error"].get("field")) == (want, field), (base, path, name, resp)
            assert resp["error"]["code"] and resp["error"]["message"], (path, name, resp)
    assert fivexx == [], fivexx
    assert tried == len(cases()) * len(targets) and tried > 400
    # Agent 0's state is as it was, though every case was also sent to its admin port directly.
    assert await snapshot(http, agents[0]) == agent_before
    state = await wait_reachable(http, ctl.url, workers=2)
    assert state["desired"]["weight_version"] == "v1" and state["pause_state"] == "running"
    assert all(w["weight_version"] == "v1" and w["paused"] is False for w in state["workers"])
    for _ in range(5):
        status, headers = await rollout(http, gateway_url)
        assert status == 200 and headers["X-RL-Weight-Version"] == "v1"

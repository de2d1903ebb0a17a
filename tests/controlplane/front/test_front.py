"""The API front (`rlcp/controlplane/front/`) of a real controller daemon over sim agents: reads
answered from its replica, writes proxied and then visible, and the front's behaviour when
the core behind it stops, hangs or dies."""

from __future__ import annotations

import os
import signal
from typing import Any

import aiohttp
import pytest

from rlcp.core.cached import parse_tag
from rlcp.harness.controller import AUTH
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.procfs import controller_pids, gone
from rlcp.harness.waiting import wait_for
from tests.support.fleets import FleetShape

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(settings={"api": {"front_stale_s": 1.0, "front_timeout_s": 2.0}})


def core_pid(ctl: ControllerProcess) -> int:
    pids = controller_pids(ctl.pid)
    assert set(pids) == {"controller-front", "controller-core"}, pids
    return pids["controller-core"]


async def get(http: aiohttp.ClientSession, url: str, **kw) -> tuple[int, dict | None, Any]:
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=5), **kw) as resp:
        body = await resp.json() if resp.status != 304 else None
        return resp.status, body, resp.headers


async def test_a_write_is_in_the_state_read_right_after_it(daemon_fleet) -> None:
    _, ctl, http = daemon_fleet
    async with http.post(ctl.url + "/v1/rl/pause", json={"mode": "keep"}, headers=AUTH) as resp:
        result = await resp.json()
        assert resp.status == 200, result
    status, state, headers = await get(http, ctl.url + "/v1/rl/state")
    assert status == 200 and state["last_operation"]["id"] == result["id"] and state["pause_state"] == "paused"
    assert parse_tag(headers["ETag"]) is not None  # the core's tag, naming its generation
    # A conditional read with the tag just read is a 304 with that tag, unless the state moved in
    # between (the reconciler reads the workers after the pause, on its own schedule): then a 200
    # with a new tag, to ask with next. The state settles, so a 304 comes.
    tag = headers["ETag"]

    async def not_modified() -> bool:
        nonlocal tag
        status, _, again = await get(http, ctl.url + "/v1/rl/state", headers={"If-None-Match": tag})
        if status == 200:
            assert again["ETag"] != tag  # a 200 only for a state that moved
            tag = again["ETag"]
            return False
        assert status == 304 and again["ETag"] == tag
        return True

    await wait_for(not_modified, what="a 304 to a read with the current tag")
    # Bad input comes back as the core named it, and an operation's record through the proxy.
    async with http.post(
        ctl.url + "/v1/rl/update_weights", json={"version": "v2", "source": {"kind": "disk"}}, headers=AUTH
    ) as resp:
        body = await resp.json()
        assert resp.status == 422 and body["error"]["field"].startswith("source"), body
    status, op, _ = await get(http, f"{ctl.url}/v1/rl/operations/{result['id']}")
    assert status == 200 and op["id"] == result["id"]


# Selectors the core refuses (422 naming `selector`): the front once answered each from its
# replica, 200 with the whole document.
BAD_SELECTORS = (
    "role in",
    "role in policy",
    "role in (policy",
    "bad key=x",
    "role=policy,",
    "=x",
    "a===b",
    "!",
    "a!=!b",
    "(",
    "x in (a b)",
    "x notin",
    "a=b=c",
    "a,,b",
    "a b",
    "x" * 254,
    "role=" + "v" * 64,
    "!a=b",
    "in (a)",
    "s" * 600,
)


async def test_a_state_read_with_a_selector_is_answered_as_the_core_answers_it(daemon_fleet) -> None:
    _, ctl, http = daemon_fleet
    status, whole, _ = await get(http, ctl.url + "/v1/rl/state")
    assert status == 200 and len(whole["workers"]) == 2
    for selector in BAD_SELECTORS:
        status, body, _ = await get(http, ctl.url + "/v1/rl/state", params={"selector": selector})
        assert status == 422 and body["error"]["field"] == "selector", (selector, body)
    # A good selector filters the members, as the core does; the plain read is still the whole fleet.
    status, none, headers = await get(http, ctl.url + "/v1/rl/state", params={"selector": "role=policy"})
    assert status == 200 and none["workers"] == [] and "ETag" not in headers, none
    status, every, _ = await get(http, ctl.url + "/v1/rl/state", params={"selector": "!role"})
    assert status == 200 and [w["id"] for w in every["workers"]] == [w["id"] for w in whole["workers"]]
    status, again, _ = await get(http, ctl.url + "/v1/rl/state")
    assert status == 200 and len(again["workers"]) == 2


async def test_reads_are_answered_while_the_core_is_stopped(daemon_fleet) -> None:
    _, ctl, http = daemon_fleet
    core = core_pid(ctl)
    os.kill(core, signal.SIGSTOP)
    try:
        # Liveness follows the core: once it has not answered for front_stale_s, /healthz fails.
        # From then on the replica is the core's last answer: any read the core answered just
        # before it stopped has landed (the fleet may still have been settling: a status read's
        # last_seen was seen moving between a read before the stop and the next).
        status, health, _ = await wait_for(lambda: _unhealthy(http, ctl.url), 10, "the front's /healthz to fail")
        assert status == 503 and health["status"] == "core_unresponsive" and "state read" in health["reason"]
        status, before, headers = await get(http, ctl.url + "/v1/rl/state")
        assert status == 200
        for _ in range(20):  # the replica answers at once; the core could not answer at all
            status, state, _ = await get(http, ctl.url + "/v1/rl/state")
            assert status == 200 and state == before
        status, _, _ = await get(http, ctl.url + "/v1/rl/state", headers={"If-None-Match": headers["ETag"]})
        assert status == 304
        async with http.post(ctl.url + "/v1/rl/resume") as resp:  # no token: refused here, never sent on
            assert resp.status == 401 and (await resp.json())["error"]["field"] == "Authorization"
        async with http.post(ctl.url + "/v1/rl/resume", headers=AUTH) as resp:  # sent on: the core is stopped
            body = await resp.json()
            assert resp.status == 504 and body["error"]["code"] == "core_timeout", body
            assert "POST /v1/rl/resume" in body["error"]["message"]
    finally:
        os.kill(core, signal.SIGCONT)
    await wait_for(lambda: _healthy(http, ctl.url), 10, "the front's /healthz to pass again")


async def _unhealthy(http: aiohttp.ClientSession, url: str):
    answer = await get(http, url + "/healthz")
    return answer if answer[0] == 503 else None


async def _healthy(http: aiohttp.ClientSession, url: str) -> bool:
    return (await get(http, url + "/healthz"))[0] == 200


async def test_when_the_core_dies_the_front_exits(daemon_fleet) -> None:
    ctl = daemon_fleet.ctl
    os.kill(core_pid(ctl), signal.SIGKILL)
    await wait_for(lambda: not ctl.running(), 15, "the front to exit after its core died")
    assert ctl.proc is not None and ctl.proc.returncode != 0


async def test_when_the_front_dies_the_core_stops(daemon_fleet) -> None:
    ctl = daemon_fleet.ctl
    core = core_pid(ctl)
    os.kill(ctl.pid, signal.SIGKILL)  # the front alone, as an OOM kill would
    await wait_for(lambda: gone(core), 30, "the core to stop once its front was gone")


def test_tags_name_their_generation() -> None:
    assert parse_tag('W/"a1b2c3.42"') == ("a1b2c3", 42)
    assert parse_tag('"a1b2c3.7"') == ("a1b2c3", 7)
    assert parse_tag('W/"nogeneration"') is None and parse_tag('W/"x.y"') is None

"""The gateway's bounds, over real agents on SimEngine inside a real controller: the hold queue
(`gateway.max_held`) answers 503 at once when full, a body over `gateway.max_body_bytes`
is refused with 413 before any worker is called, and a request that failed on every member
before the first byte goes round again, up to `gateway.attempts` tries in all."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from rlcp.harness.faults import Fault
from rlcp.harness.waiting import LoopStalls, wait_for
from tests.support.fleets import FleetShape

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(settings={"gateway": {"port": 0, "max_held": 2, "hold_timeout_s": 10, "max_body_bytes": 4096}})


async def post(http: aiohttp.ClientSession, url: str, **kw) -> tuple[int, dict[str, str], dict]:
    async with http.post(f"{url}/v1/completions", **kw) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def test_a_full_hold_queue_answers_503_at_once_and_the_held_still_go_out(gateway_fleet) -> None:
    agents, ctl, gateway, http = gateway_fleet
    body = {"model": "sim", "prompt": "hi", "max_tokens": 2}
    status, _ = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep"})
    assert status == 200
    await wait_for(lambda: not gateway.router.table().routes, what="the fence empty while paused")
    held = [asyncio.create_task(post(http, gateway.url, json=body)) for _ in range(2)]
    await wait_for(lambda: gateway.held == 2, what="two requests held")
    loop = asyncio.get_running_loop()
    async with LoopStalls() as stalls:
        t0 = loop.time()
        status, headers, answer = await post(http, gateway.url, json=body)
        # Not held until the 10 s deadline: refused at once (the loop's stalls left out).
        assert loop.time() - t0 - stalls.s < 5
    assert status == 503 and headers["Retry-After"] == "1" and "X-RL-Worker" not in headers
    assert answer["error"]["code"] == "no_capacity" and "max_held" in answer["error"]["message"]
    assert gateway.rejected == 1 and not any(t.done() for t in held)
    status, _ = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200
    answers = await asyncio.wait_for(asyncio.gather(*held), 20)
    assert [s for s, _, _ in answers] == [200, 200] and gateway.held == 0


async def test_a_body_over_the_limit_is_413_before_any_worker(gateway_fleet) -> None:
    agents, ctl, gateway, http = gateway_fleet
    before = sum(gateway.routed.values())
    big = {"model": "sim", "prompt": "x" * 8192, "max_tokens": 2}
    status, headers, answer = await post(http, gateway.url, json=big)
    assert status == 413 and "X-RL-Worker" not in headers
    assert answer["error"]["field"] == "body" and "4096" in answer["error"]["message"]
    assert sum(gateway.routed.values()) == before
    assert all(a.engine.request_counts().running == 0 for a in agents)
    status, headers, _ = await post(http, gateway.url, json={"model": "sim", "prompt": "x", "max_tokens": 2})
    assert status == 200 and headers["X-RL-Worker"] in {"w0", "w1"}


async def test_a_request_every_member_failed_once_goes_round_again_then_502_names_each_try(gateway_fleet) -> None:
    agents, ctl, gateway, http = gateway_fleet
    body = {"model": "sim", "prompt": "hi", "max_tokens": 2}
    # Each member resets the connection once (as a pooled connection the worker had just
    # closed does): both fail, and the third try, on a member tried before, answers.
    for a in agents:
        a.inference_faults.add("POST", "/v1/completions", Fault("reset", times=1))
    status, headers, _ = await post(http, gateway.url, json=body)
    assert status == 200 and headers["X-RL-Worker"] in {"w0", "w1"}
    assert sum(gateway.failed.values()) == 2 and all(a.inference_faults.rules == {} for a in agents)
    # Failing every time: 502 after `attempts` (3) tries, each named.
    for a in agents:
        a.inference_faults.add("POST", "/v1/completions", Fault("reset"))
    status, _, answer = await post(http, gateway.url, json=body)
    assert status == 502 and answer["error"]["code"] == "upstream_failed", answer
    message = answer["error"]["message"]
    assert message.startswith("3 tries failed before an answer") and "w0: " in message and "w1: " in message

"""`GET /v1/rl/state` over HTTP as readers see it: gzip for those that accept it (the same
bytes once decompressed), `ETag` / `If-None-Match` answered 304 with no body while nothing
changed, a new tag when the state changes or the controller is another one, and the
standalone gateway's follower reading 304s without parsing anything."""

from __future__ import annotations

import gzip

import aiohttp
import pytest

from rlcp.controlplane.gateway.follow import FollowedState
from rlcp.core.wire.controller.state import FleetState
from rlcp.harness.controller import CTL_TOKEN, start_controller
from tests.support.fleets import FleetShape

pytestmark = pytest.mark.timeout(60)
# The poll runs once, at start, here: the tests below count the changes they make themselves.
QUIET = {"poll_interval_s": 600, "interval_s": 600}


@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(settings={"reconcile": QUIET})


@pytest.fixture
async def raw_http():
    async with aiohttp.ClientSession(auto_decompress=False) as raw:  # sees the bytes on the wire
        yield raw


async def test_gzip_plain_and_not_modified(sim_fleet, raw_http) -> None:
    ctl, raw = sim_fleet.ctl, raw_http
    url = ctl.url + "/v1/rl/state"
    async with raw.get(url, headers={"Accept-Encoding": "identity"}) as resp:
        plain, tag = await resp.read(), resp.headers["ETag"]
        assert resp.status == 200 and "Content-Encoding" not in resp.headers
        assert resp.headers["Vary"] == "Accept-Encoding" and resp.headers["Content-Type"] == "application/json"
    async with raw.get(url, headers={"Accept-Encoding": "gzip, deflate"}) as resp:
        zipped = await resp.read()
        assert resp.status == 200 and resp.headers["Content-Encoding"] == "gzip" and resp.headers["ETag"] == tag
    assert gzip.decompress(zipped) == plain and plain == ctl.ctl.state_json()
    async with raw.get(url, headers={"If-None-Match": tag, "Accept-Encoding": "gzip"}) as resp:
        assert resp.status == 304 and await resp.read() == b"" and resp.headers["ETag"] == tag
    # aiohttp's client (the benches', the gateway's) asks for gzip and decompresses by itself.
    async with ctl.client.get("/v1/rl/state") as resp:
        assert resp.headers["Content-Encoding"] == "gzip" and await resp.read() == plain


async def test_a_change_or_another_controller_gives_a_new_tag(sim_fleet, raw_http, tmp_path) -> None:
    (ctl, agents), raw = sim_fleet, raw_http
    url = ctl.url + "/v1/rl/state"
    async with raw.get(url) as resp:
        tag = resp.headers["ETag"]
    status, _ = await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
    assert status == 200
    async with raw.get(url, headers={"If-None-Match": tag}) as resp:
        assert resp.status == 200 and resp.headers["ETag"] != tag
        paused_tag = resp.headers["ETag"]
    other = await start_controller(
        tmp_path, agents, reconcile=QUIET
    )  # another process, counting from zero: never a 304
    try:
        async with raw.get(other.url + "/v1/rl/state", headers={"If-None-Match": f"{tag}, {paused_tag}"}) as resp:
            assert resp.status == 200 and resp.headers["ETag"] not in (tag, paused_tag)
    finally:
        await other.client.close()


def status_trace() -> tuple[aiohttp.TraceConfig, list[int]]:
    """A client trace, and the status of every answer a session with it gets, in order."""
    statuses: list[int] = []

    async def on_end(session, ctx, params) -> None:
        statuses.append(params.response.status)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    return trace, statuses


@pytest.mark.parametrize("decompress", [True, False], ids=["aiohttp-default", "gateway-session"])
async def test_the_follower_reads_304s_without_parsing(sim_fleet, monkeypatch: pytest.MonkeyPatch, decompress) -> None:
    """Both with a session that decompresses and with the gateway's own (`auto_decompress=False`,
    as a proxy must), which still asks for gzip."""
    ctl = sim_fleet.ctl
    trace, statuses = status_trace()
    async with aiohttp.ClientSession(trace_configs=[trace], auto_decompress=decompress) as session:
        followed = FollowedState(session=session, url=ctl.url, token=CTL_TOKEN, interval_s=0.0)
        await followed.read_once()
        first = followed.current()
        assert first is not None and followed.last_error is None
        parsed: list[bytes] = []
        real = FleetState.model_validate_json
        monkeypatch.setattr(FleetState, "model_validate_json", lambda body: parsed.append(body) or real(body))
        await followed.read_once()
        assert statuses == [200, 304] and followed.current() == first and parsed == []
        await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
        await followed.read_once()
        now = followed.current()
        assert statuses[-1] == 200 and len(parsed) == 1 and now is not None
        assert now[0] == first[0] + 1 and now[1].desired.paused is True and followed.last_error is None


async def test_the_python_client_polls_with_its_tag(sim_fleet) -> None:
    from rlcp.client.client import ControlPlaneClient

    ctl = sim_fleet.ctl
    trace, statuses = status_trace()
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        client = ControlPlaneClient(ctl.url, token=CTL_TOKEN, session=session)
        first = await client.state_raw()
        again = await client.state_raw()  # nothing changed: a 304, the document kept
        assert statuses == [200, 304] and again is first
        status, _ = await ctl.call("POST", "/v1/rl/pause", {"mode": "abort"})
        assert status == 200
        changed = await client.state()
        assert statuses[-1] == 200 and changed.desired.paused

"""Routes that take no body model (vLLM's `/sleep?level=`, `/wake_up`, `/reset_prefix_cache`,
`/pause?mode=`, `/resume`) still read the body: a body that is not a JSON object is a 400
naming `body` before any worker is touched (a malformed body once put a worker to sleep); a
JSON object vLLM would ignore is ignored, as vLLM does."""

from __future__ import annotations

import pytest

from rlcp.harness.controller import AUTH
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(60)

_ROUTES = ["/sleep?level=1", "/wake_up", "/reset_prefix_cache", "/pause?mode=keep", "/resume"]
_MALFORMED = {
    "broken JSON": b'{"level": ',
    "a JSON array": b"[1, 2]",
    "a JSON string": b'"sleep"',
    "nested 10,000 deep": b"[" * 10_000 + b"]" * 10_000,
    "not UTF-8": b'{"level": "\xff"}',
    "whitespace": b"   ",
}


@pytest.mark.parametrize("path", _ROUTES)
async def test_a_malformed_body_is_a_400_naming_body_and_touches_no_worker(sim_fleet, path):
    ctl, agents = sim_fleet
    await ctl.wait_reachable()
    await ctl.wait_settled()
    for name, data in _MALFORMED.items():
        rid = fresh_request_id("malformed")
        headers = with_request_id(rid, {**AUTH, "Content-Type": "application/json"})
        status, body = await ctl.call("POST", path, data=data, headers=headers)
        assert status == 400, (path, name, body)
        assert body["error"]["field"] == "body", (path, name, body)
        assert_no_worker_touched(agents, rid, (path, name))
    assert all(not a.service.state().sleeping and not a.service.state().paused for a in agents)


async def test_an_object_body_is_ignored_as_vllm_does(sim_fleet):
    ctl, agents = sim_fleet
    await ctl.wait_reachable()
    status, body = await ctl.call("POST", "/reset_prefix_cache", {"anything": [1, {"x": None}]})
    assert status == 200, body
    status, body = await ctl.call("POST", "/pause?mode=keep", data=b"", headers=AUTH)
    assert status == 200, body
    status, body = await ctl.call("POST", "/resume", {})
    assert status == 200, body
    assert all(not a.service.state().paused for a in agents)

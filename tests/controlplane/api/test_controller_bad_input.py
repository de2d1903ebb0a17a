"""Bad input to every controller route: a clear 4xx naming the field, and no worker touched."""

from __future__ import annotations

import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import start_controller
from rlcp.harness.simfleet import start_fleet
from rlcp.harness.waiting import wait_for
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(120)


def cases(root: str, ckpt: str) -> list[tuple[str, str, str, object, int, str]]:
    good = {"kind": "disk", "path": ckpt}
    uw = "/v1/rl/update_weights"
    return [
        ("missing version", "POST", uw, {"source": good}, 422, "version"),
        ("missing source", "POST", uw, {"version": "v"}, 422, "source"),
        (
            "unknown source kind",
            "POST",
            uw,
            {"version": "v", "source": {"kind": "s3", "path": ckpt}},
            422,
            "source.kind",
        ),
        ("relative path", "POST", uw, {"version": "v", "source": {"path": "ckpt"}}, 403, "source.path"),
        ("outside roots", "POST", uw, {"version": "v", "source": {"path": "/etc"}}, 403, "source.path"),
        ("traversal", "POST", uw, {"version": "v", "source": {"path": f"{root}/../../etc"}}, 403, "source.path"),
        ("bad pause mode", "POST", uw, {"version": "v", "source": good, "pause_mode": "nap"}, 422, "pause_mode"),
        ("negative timeout", "POST", uw, {"version": "v", "source": good, "timeout_s": -1}, 422, "timeout_s"),
        ("unknown field", "POST", uw, {"version": "v", "source": good, "verfy": True}, 422, "verfy"),
        ("version with space", "POST", uw, {"version": "a b", "source": good}, 422, "version"),
        ("version wrong type", "POST", uw, {"version": 3, "source": good}, 422, "version"),
        ("not json", "POST", uw, b"{nope", 400, "body"),
        ("json array", "POST", uw, b"[]", 400, "body"),
        ("oversized", "POST", uw, b"{" + b" " * (2 << 20) + b"}", 413, "body"),
        ("pause mode", "POST", "/v1/rl/pause", {"mode": "sleep"}, 422, "mode"),
        ("pause zero timeout", "POST", "/v1/rl/pause", {"mode": "abort", "timeout_s": 0}, 422, "timeout_s"),
        # A literal of ints (vLLM's levels 1 and 2) matched `true` and `1.0`: they put members to sleep.
        *(
            (f"sleep level {level!r}", "POST", "/v1/rl/sleep", {"level": level}, 422, "level")
            for level in (True, 1.0, "1", 0, 3)
        ),
        ("resume extra", "POST", "/v1/rl/resume", {"force": True}, 422, "force"),
        ("lora bad name", "POST", "/v1/rl/loras", {"name": "a b", "path": ckpt}, 422, "name"),
        ("lora no path", "POST", "/v1/rl/loras", {"name": "a"}, 422, "path"),
        ("lora outside", "POST", "/v1/rl/loras", {"name": "a", "path": "/tmp/x"}, 403, "path"),
        ("unload unknown", "DELETE", "/v1/rl/loras/ghost", None, 404, "name"),
    ]


async def test_bad_input_touches_no_worker(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", 1)
    agents = await start_fleet(2, [tmp_path])
    ctl = await start_controller(tmp_path, agents)
    try:
        await wait_for(lambda: not any(ctl.ctl.reconciler.needs_work(r) for r in ctl.ctl.members()), what="settled")
        # Each request is judged by the worker calls that carried its own id: the reconciler's are
        # not the rejected requests' (a loop stall on a loaded machine made both workers look
        # unreachable for a moment, and it sent them their desired state again when they came back).
        for name, method, path, body, want, field in cases(str(tmp_path), str(ckpt)):
            data = body if isinstance(body, bytes) else None
            rid = fresh_request_id("bad-input")
            status, resp = await ctl.call(method, path, None if data else body, data=data, headers=with_request_id(rid))
            assert status == want, (name, resp)
            assert resp["error"]["field"] == field and resp["error"]["message"], (name, resp)
            assert_no_worker_touched(agents, rid, name)
        for method, path in [
            ("POST", "/v1/rl/update_weights"),
            ("POST", "/v1/rl/pause"),
            ("POST", "/v1/rl/resume"),
            ("POST", "/v1/rl/loras"),
            ("DELETE", "/v1/rl/loras/x"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                rid = fresh_request_id("bad-token")
                status, resp = await ctl.call(method, path, {}, headers=with_request_id(rid, headers))
                assert status == 401 and resp["error"]["code"] == "unauthorized", (method, path)
                assert_no_worker_touched(agents, rid, (method, path, headers))
        assert ctl.ctl.desired.state.weight_version is None
        status, _ = await ctl.call("GET", "/v1/rl/state", headers={})
        assert status == 200
    finally:
        await ctl.client.close()
        for a in agents:
            await a.stop()

"""Version names on the agent's admin API (a real agent on SimEngine, on loopback): every
route that takes one refuses a name unsafe in an HTTP header with a 422 naming the field,
and nothing changes -- no version, desired version, pause flag or adapter, no operation run,
and `GET /v1/agent/state` keeps answering (a stored lone surrogate once made it a 500)."""

from __future__ import annotations

import aiohttp
import pytest

from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.http import bearer, call
from rlcp.harness.simfleet import TOKEN, SimAgent

pytestmark = pytest.mark.timeout(60)

BAD_NAMES = ["v\u0001x", "v\x00", "v\x1f", "v\x7f", "v5\n", "\tv", "a b", "", " ", "x" * 5000, "v\ud800x", "v\u00e9"]


async def snapshot(http: aiohttp.ClientSession, agent: SimAgent) -> dict:
    status, st = await call(http, "GET", agent.url + "/v1/agent/state")
    assert status == 200, st
    return {k: st[k] for k in ("weight_version", "paused", "loras", "desired_weight_version")} | {
        "operations": [op["id"] for op in st["last_operations"]]
    }


async def test_a_bad_version_name_is_a_422_naming_the_field_and_changes_nothing(sim_agent, http, tmp_path):
    agent = sim_agent
    ckpt, adapter = write_checkpoint(tmp_path / "ckpt", 1), write_adapter(tmp_path / "adapter")
    routes = [
        ("PUT", "/v1/agent/desired", lambda v: {"weight_version": v}, "weight_version"),
        ("POST", "/v1/agent/prepare", lambda v: {"desired_weight_version": v}, "desired_weight_version"),
        ("POST", "/v1/agent/weights/disk", lambda v: {"path": str(ckpt), "version": v}, "version"),
        ("POST", "/update_weight_version", lambda v: {"new_version": v}, "new_version"),
        ("POST", "/finish_weight_update", lambda v: {"weight_version": v}, "weight_version"),
        ("POST", "/v1/agent/loras", lambda v: {"name": "a", "path": str(adapter), "version": v}, "version"),
    ]
    before = await snapshot(http, agent)
    for method, path, body, field in routes:
        for name in BAD_NAMES:
            status, resp = await call(http, method, agent.url + path, body=body(name), headers=bearer(TOKEN))
            assert status == 422, (path, name, resp)
            assert resp["error"]["field"] == field and resp["error"]["code"] == "validation_error", (path, resp)
    assert await snapshot(http, agent) == before
    assert agent.engine.served_version == before["weight_version"] and not agent.service.paused
    # A good name still goes through every one of them.
    status, resp = await call(
        http, "PUT", agent.url + "/v1/agent/desired", body={"weight_version": "step-7"}, headers=bearer(TOKEN)
    )
    assert status == 200 and resp["desired_weight_version"] == "step-7", resp

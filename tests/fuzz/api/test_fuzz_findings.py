"""What the API fuzzing found, pinned: each finding as a plain test against a controller over one
SimEngine agent, so that it stays fixed whatever the fuzzing's seed or number of examples.
"""

from __future__ import annotations

import pytest

from rlcp.harness.controller import start_controller
from rlcp.harness.simfleet import TOKEN, start_fleet

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(300)]


async def test_fuzz_findings_stay_fixed(tmp_path):
    agents = await start_fleet(1, [tmp_path])
    ctl = await start_controller(tmp_path, agents)
    agent, auth = agents[0], {"Authorization": f"Bearer {TOKEN}"}
    http = ctl.client.session
    try:
        # 405 names the allowed methods (RFC 9110), token or not; an unknown route is a 404, not a 401.
        for base in (str(ctl.client.make_url("")).rstrip("/"), agent.url):
            async with http.put(base + "/healthz") as resp:
                assert resp.status == 405 and "GET" in resp.headers["Allow"]
            async with http.post(base + "/nope") as resp:
                assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
        # JSON bodies are typed: no quiet coercion of "no" to False or true to 1.0 s.
        for body, field in (
            ({"version": "v", "source": {"path": str(tmp_path)}, "verify": "no"}, "verify"),
            ({"version": "v", "source": {"path": str(tmp_path)}, "timeout_s": True}, "timeout_s"),
        ):
            status, resp = await ctl.call("POST", "/v1/rl/update_weights", body)
            assert (status, resp["error"]["field"]) == (422, field)
        assert (await ctl.call("POST", "/pause?mode=keep&timeout_s=5"))[0] == 200  # a query stays text
        # The facade's errors name the facade's fields.
        status, resp = await ctl.call("POST", "/load_lora_adapter", {"lora_name": "a b", "lora_path": str(tmp_path)})
        assert (status, resp["error"]["field"]) == (422, "lora_name") and resp["error"]["message"].startswith(
            "lora_name"
        )
        for body, field in (
            ({"weight_dir": "/"}, "weight_dir"),
            ({"weight_dir": str(tmp_path), "weight_version": ""}, "weight_version"),
        ):
            status, resp = await ctl.call("POST", "/update_weights", body)
            assert (status, resp["error"]["field"]) == (422, field), resp
        # The agent refuses weight-transfer calls out of order with a 409, before the engine.
        chunks = agent.engine.weight_update_chunks
        for path in ("/start_weight_update", "/finish_weight_update"):
            async with http.post(agent.url + path, headers=auth) as resp:
                assert resp.status == 409, path
        async with http.post(agent.url + "/update_weights", json={"update_info": {}}, headers=auth) as resp:
            assert resp.status == 409
        for path in ("/init_weight_transfer_engine", "/start_weight_update"):
            async with http.post(
                agent.url + path, json={"init_info": {}} if "init" in path else None, headers=auth
            ) as resp:
                assert resp.status == 200, path
        async with http.post(agent.url + "/start_weight_update", headers=auth) as resp:
            assert resp.status == 409 and "already open" in (await resp.json())["error"]["message"]
        # A chunk the engine cannot read is its refusal (502), not a crash (500); the update is over.
        async with http.post(agent.url + "/update_weights", json={"update_info": {"names": 7}}, headers=auth) as resp:
            assert resp.status == 502 and (await resp.json())["error"]["code"] == "engine_error"
        async with http.post(agent.url + "/finish_weight_update", headers=auth) as resp:
            assert resp.status == 409
        assert agent.engine.weight_update_chunks == chunks
    finally:
        await ctl.client.close()
        await agent.stop()

"""The compatibility facade: RL code written for one vLLM server drives the whole fleet."""

from __future__ import annotations

import pytest

from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.controller import AUTH
from rlcp.harness.faults import Fault
from rlcp.harness.waiting import wait_for
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(120)


async def test_vllm_rl_route_shapes_drive_every_worker(sim_fleet):
    ctl, agents = sim_fleet
    assert await ctl.call("POST", "/pause?mode=keep") == (200, {"status": "paused"})
    assert all(a.service.paused for a in agents)
    assert await ctl.call("GET", "/is_paused", headers={}) == (200, {"is_paused": True})
    assert await ctl.call("POST", "/resume") == (200, {"status": "resumed"})
    assert await ctl.call("GET", "/is_paused", headers={}) == (200, {"is_paused": False})
    assert await ctl.call("GET", "/get_world_size", headers={}) == (200, {"world_size": 2})
    status, body = await ctl.call("POST", "/pause?mode=nap")
    assert status == 422 and body["error"]["field"] == "mode"


async def test_disk_and_lora_routes_frameworks_call(sim_fleet, tmp_path):
    ctl, agents = sim_fleet
    ckpt = write_checkpoint(tmp_path / "step-3", 3)
    status, body = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt)})
    assert (status, body["weight_version"]) == (200, "step-3")
    assert all(a.service.weight_version == "step-3" for a in agents)
    assert await ctl.call("GET", "/weight_info", headers={}) == (200, {"weight_version": "step-3"})
    status, _ = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt), "weight_version": "named"})
    assert status == 200 and all(a.service.weight_version == "named" for a in agents)

    adapter = write_adapter(tmp_path / "ad")
    status, body = await ctl.call("POST", "/load_lora_adapter", {"lora_name": "ad", "lora_path": str(adapter)})
    assert status == 200 and body["success"] is True
    assert all([lo.name for lo in a.service.state().loras] == ["ad"] for a in agents)
    # What the fleet serves, the base model included (prime-rl checks its model name here): these
    # members have no inference URL to ask, so they count with what they report of themselves.
    base = agents[0].service.state().model
    status, models = await ctl.call("GET", "/v1/models", headers={})
    assert status == 200 and {m["id"]: m["parent"] for m in models["data"]} == {base: None, "ad": base}
    assert (await ctl.client.get("/health")).status == 200


async def test_facade_errors_are_never_200(sim_fleet, tmp_path):
    ctl, agents = sim_fleet
    ckpt = write_checkpoint(tmp_path / "c", 4)
    agents[0].faults["/v1/agent/weights/update"] = Fault("status", 500)
    # Failed on one member: not a 207 (vLLM-shaped clients read any 2xx as success) but a 502
    # naming it, with every worker's result.
    status, body = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt)})
    assert status == 502 and body["error"]["code"] == "workers_failed", body
    assert "w0" in body["error"]["message"] and list(body["error"]["workers"]) == ["w0"]
    results = body["error"]["operation"]["results"]
    assert {r["worker_id"]: r["status"] for r in results} == {"w0": "error", "w1": "ok"}
    await ctl.wait_settled()  # the reconciler converges w0 (by the disk route): its touches, not the bad calls'
    for payload, want, field in (
        ({}, 422, "weight_dir"),
        ({"weight_dir": "/etc"}, 403, "weight_dir"),
        ({"weight_dir": str(ckpt), "x": 1}, 422, "x"),
    ):
        rid = fresh_request_id("bad-update")
        status, body = await ctl.call("POST", "/update_weights", payload, headers=with_request_id(rid))
        assert (status, body["error"]["field"]) == (want, field)
        assert_no_worker_touched(agents, rid, payload)
    status, body = await ctl.call("POST", "/update_weights", {"weight_dir": str(ckpt)}, headers={})
    assert status == 401
    resp = await ctl.client.post("/init_weight_transfer_engine", json={}, headers=AUTH)
    assert resp.status == 422 and (await resp.json())["error"]["field"] == "init_info"


async def test_a_member_down_is_never_success_on_the_facade(sim_fleet):
    ctl, agents = sim_fleet
    await agents[1].stop()
    await wait_for(lambda: not ctl.ctl.registry.get("w1").reachable, 10, "w1 to be seen unreachable")
    # w0 pauses, w1 cannot be reached: 502 naming w1, with both results.
    status, body = await ctl.call("POST", "/pause?mode=keep")
    assert status == 502 and body["error"]["code"] == "workers_failed", body
    assert list(body["error"]["workers"]) == ["w1"] and "w1" in body["error"]["message"]
    assert {r["worker_id"]: r["status"] for r in body["error"]["operation"]["results"]} == {"w0": "ok", "w1": "error"}
    assert agents[0].service.paused
    # Every reachable member is paused, but w1 is not known to be: not paused.
    assert await ctl.call("GET", "/is_paused", headers={}) == (200, {"is_paused": False})
    # No member reached at all: 503.
    await agents[0].stop()
    await wait_for(lambda: not ctl.ctl.registry.get("w0").reachable, 10, "w0 to be seen unreachable")
    status, body = await ctl.call("POST", "/resume")
    assert status == 503 and body["error"]["code"] == "workers_unreachable", body
    assert sorted(body["error"]["workers"]) == ["w0", "w1"]
    assert await ctl.call("GET", "/is_paused", headers={}) == (200, {"is_paused": False})
    # The native API keeps its 207/502 with the operation as the body.
    status, body = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 502 and body["status"] == "failed", body


def vllm_admin_routes() -> set[tuple[str, str]]:
    """Every admin route vLLM 0.32 serves (its RL router and its dev routers), read off vLLM
    itself; its LoRA routes are attached inside a function, so named here."""
    from vllm.entrypoints.rl.online.api_router import router as rl
    from vllm.entrypoints.serve.dev.cache.api_router import router as cache
    from vllm.entrypoints.serve.dev.rpc.api_router import router as rpc
    from vllm.entrypoints.serve.dev.server_info.api_router import router as server_info
    from vllm.entrypoints.serve.dev.sleep.api_router import router as sleep

    routes = {
        (method, route.path)
        for router in (rl, cache, rpc, server_info, sleep)
        for route in router.routes
        for method in route.methods
    }
    return routes | {("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter")}


def test_every_admin_route_of_vllm_is_answered_on_the_facade():
    from rlcp.controlplane.api.openapi import ROUTES

    ours = {(r.method, r.path) for r in ROUTES}
    missing = vllm_admin_routes() - ours
    assert not missing, f"vLLM admin routes the facade leaves a silent 404: {sorted(missing)}"
    assert ("POST", "/init_broadcaster") in ours  # prime-rl's own


async def test_routes_without_fleet_meaning_say_why_and_touch_nothing(sim_fleet):
    from rlcp.controlplane.api.unsupported import REFUSED

    ctl, agents = sim_fleet
    assert await ctl.call("POST", "/init_broadcaster", {"host": "h", "port": 1}, headers={}) == (
        401,
        {"error": {"code": "unauthorized", "field": "Authorization", "message": "missing bearer token"}},
    )
    for method, path, _ in REFUSED:
        status, body = await ctl.call(method, path, {} if method == "POST" else None)
        assert status == 501 and body["error"]["code"] == "not_supported", (path, body)
        assert f"{method} {path}" in body["error"]["message"] and body["error"]["field"] == path
    assert not any(a.service.paused for a in agents) and all(a.service.weight_version == "default" for a in agents)


async def test_an_adapter_unloaded_through_the_facade_leaves_every_engine(sim_fleet, tmp_path):
    ctl, agents = sim_fleet
    adapter = write_adapter(tmp_path / "ad")
    assert (await ctl.call("POST", "/load_lora_adapter", {"lora_name": "ad", "lora_path": str(adapter)}))[0] == 200
    status, body = await ctl.call("POST", "/v1/unload_lora_adapter", {"lora_name": "ad"})
    assert (status, body) == (200, {"success": True, "message": "Success: LoRA adapter 'ad' removed."})
    assert all(not a.service.state().loras for a in agents)
    status, models = await ctl.call("GET", "/v1/models", headers={})
    assert "ad" not in {m["id"] for m in models["data"]}
    status, body = await ctl.call("POST", "/unload_lora_adapter", {"lora_name": "ad"})
    assert status == 404 and body["error"]["field"] == "lora_name", body
    status, body = await ctl.call("POST", "/unload_lora_adapter", {"lora_name": ""})
    assert status == 422 and body["error"]["field"] == "lora_name", body


async def test_sleep_and_wake_through_the_facade_are_the_fleet_sleep(sim_fleet):
    ctl, agents = sim_fleet
    assert await ctl.call("GET", "/is_sleeping", headers={}) == (200, {"is_sleeping": False})
    assert await ctl.call("POST", "/sleep?level=1") == (200, {"status": "sleeping", "level": 1})
    assert all(a.service.control.sleeping for a in agents)
    st = await ctl.state()
    assert sorted(st["desired"]["asleep"]) == ["w0", "w1"] and not any(w["serving"] for w in st["workers"])
    assert await ctl.call("GET", "/is_sleeping", headers={}) == (200, {"is_sleeping": True})
    # A colocated trainer's wake: the weights first, then the KV cache; the second completes it.
    assert await ctl.call("POST", "/wake_up?tags=weights") == (200, {"status": "sleeping", "tags": ["weights"]})
    assert all(a.service.control.sleeping for a in agents)
    assert not any(w["serving"] for w in (await ctl.state())["workers"])
    assert await ctl.call("POST", "/wake_up?tags=kv_cache") == (200, {"status": "awake", "tags": ["kv_cache"]})
    st = await ctl.state()
    assert st["desired"]["asleep"] == {} and all(w["serving"] for w in st["workers"]), st["workers"]
    assert await ctl.call("GET", "/is_sleeping", headers={}) == (200, {"is_sleeping": False})
    # A whole wake of a fleet asleep, in one call.
    assert (await ctl.call("POST", "/sleep?level=1&mode=wait"))[0] == 200
    assert await ctl.call("POST", "/wake_up") == (200, {"status": "awake", "tags": None})
    assert all(w["serving"] for w in (await ctl.state())["workers"])


@pytest.mark.parametrize(
    "path,field",
    [
        ("/sleep?level=0", "level"),
        ("/sleep?level=3", "level"),
        ("/sleep?mode=keep", "mode"),
        ("/sleep?mode=nap", "mode"),
        ("/wake_up?tags=gpu", "tags.0"),
        ("/wake_up?tags=scheduling", "tags.0"),
        ("/reset_prefix_cache?reset_running_requests=maybe", "reset_running_requests"),
    ],
)
async def test_bad_sleep_wake_and_reset_queries_touch_no_worker(sim_fleet, path, field):
    ctl, agents = sim_fleet
    rid = fresh_request_id("bad-query")
    status, body = await ctl.call("POST", path, headers=with_request_id(rid))
    assert status == 422 and body["error"]["field"] == field, body
    # What this request did, by its id: the reconciler may re-send a worker its desired state
    # meanwhile (a loop stall under load made a member look unreachable and come back).
    assert_no_worker_touched(agents, rid, path)
    # The check can fail: a request that is carried out is seen by its id.
    rid = fresh_request_id("good-query")
    assert (await ctl.call("POST", "/reset_prefix_cache", headers=with_request_id(rid)))[0] == 200
    assert all(a.touched_by(rid) for a in agents)


async def test_reset_prefix_cache_resets_every_member_and_a_failure_is_a_failure(sim_fleet):
    ctl, agents = sim_fleet
    before = [a.engine.prefix_cache_resets for a in agents]
    assert await ctl.call("POST", "/reset_prefix_cache") == (200, {"success": True})
    assert [a.engine.prefix_cache_resets for a in agents] == [n + 1 for n in before]
    status, result = await ctl.call("POST", "/v1/rl/reset_prefix_cache", {"reset_running_requests": True})
    assert status == 200 and result["kind"] == "reset_prefix_cache", result

    async def held(*, include_running: bool, external: bool = False) -> bool:
        return False  # vLLM's answer while running requests hold blocks

    agents[1].engine.reset_prefix_cache = held  # type: ignore[method-assign]
    status, body = await ctl.call("POST", "/reset_prefix_cache")
    assert status == 502 and list(body["error"]["workers"]) == ["w1"], body
    assert "success=false" in body["error"]["workers"]["w1"], body
    agents[0].faults["/reset_prefix_cache"] = Fault("status", 500)
    status, body = await ctl.call("POST", "/reset_prefix_cache")
    assert status == 502 and sorted(body["error"]["workers"]) == ["w0", "w1"], body


async def test_collective_rpc_reload_weights_is_the_verified_disk_update(sim_fleet, tmp_path):
    ctl, agents = sim_fleet
    ckpt = write_checkpoint(tmp_path / "step-7", 7)
    status, body = await ctl.call(
        "POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(ckpt)}}
    )
    assert (status, body) == (200, {"results": [None, None]}), body
    assert all(a.service.weight_version == "step-7" for a in agents)
    st = await ctl.state()
    assert st["applied"]["weight_version"] == "step-7" and st["applied"]["verified"] is True
    for payload, want, field in (
        ({"method": "reload_weights", "kwargs": {"weights_path": "/etc"}}, 403, "kwargs.weights_path"),
        ({"method": "reload_weights"}, 422, "kwargs.weights_path"),
        ({"method": "reload_weights", "kwargs": {"path": str(ckpt)}}, 422, "kwargs.path"),
        ({"method": "reload_weights", "args": [str(ckpt)]}, 422, "kwargs.weights_iterator"),
        ({"method": "start_weight_update", "args": [1]}, 422, "args"),
        ({"method": "init_weight_transfer_engine", "kwargs": {"init_info": 3}}, 422, "kwargs.init_info"),
        ({"method": "reload_weights", "timeout": "soon", "kwargs": {"weights_path": str(ckpt)}}, 422, "timeout"),
        ({"args": []}, 422, "method"),
        ({"method": "execute_model"}, 501, "method"),
        ({"method": "start_draft_weight_update"}, 501, "method"),
    ):
        rid = fresh_request_id("bad-rpc")
        status, body = await ctl.call("POST", "/collective_rpc", payload, headers=with_request_id(rid))
        assert (status, body["error"]["field"]) == (want, field), (payload, body)
        if want == 501:
            assert repr(payload["method"]) in body["error"]["message"], body
        assert_no_worker_touched(agents, rid, payload)


async def test_collective_rpc_weight_protocol_is_the_fleet_broadcast(sim_fleet):
    ctl, agents = sim_fleet
    chunk = {"names": ["model.embed_tokens.weight"], "dtype_names": ["float32"], "shapes": [[8, 4]]}
    await wait_for(lambda: all(r.status and r.status.world_size for r in ctl.ctl.members()), what="world sizes")
    for method, kwargs in (
        (
            "init_weight_transfer_engine",
            {"init_info": {"master_address": "127.0.0.1", "master_port": 29999, "rank_offset": 1, "world_size": 3}},
        ),
        ("start_weight_update", {}),
        ("update_weights", {"update_info": chunk}),
        ("finish_weight_update", {}),
    ):
        status, body = await ctl.call("POST", "/collective_rpc", {"method": method, "kwargs": kwargs})
        assert (status, body) == (200, {"results": [None, None]}), (method, body)
    assert all(a.engine.weight_update_chunks == 1 for a in agents)
    assert not any(a.service.paused for a in agents)  # finish resumed what start paused
    assert await ctl.call("POST", "/update_weight_version", {"new_version": "b1"}) == (
        200,
        {"success": True, "new_version": "b1"},
    )
    assert all(a.service.weight_version == "b1" for a in agents)
    status, body = await ctl.call("POST", "/collective_rpc", {"method": "shutdown_weight_transfer_engine"})
    assert status == 200 and (await ctl.state())["weight_transfer"] is None, body

"""Every route vLLM 0.32 serves, read off vLLM's own routers, answered by the fleet: an admin
route (its RL router, its dev and serving-ops routers) on the controller's vLLM-shaped facade
with its fleet meaning or its documented 501, an inference route (OpenAI, Anthropic, Cohere,
pooling, tokenizer, scale-out) forwarded by the gateway inside the fence or refused with its
documented 501. Not fitted to the clients we know: a route vLLM adds fails here until it has
an answer (and a row in docs/controller.md's table).

Over SimEngine agents (what the controller does with each route; the real engines' side of the
same calls is tests/e2e/test_facade_vllm.py)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path
from typing import Any

import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.waiting import wait_for
from tests.support.fleets import FleetShape, GatewayFleet

# vLLM is imported by the test that reads its routers, not at collection (~7 s in every process).
# The timeout guards a hang only: importing every vLLM router module is CPU work that took past
# 120 s beside a full run at load ~20 (the fast lane beside CI28).
pytestmark = [pytest.mark.timeout(900), pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm")]

# Routers attached inside a function (not module-level `APIRouter`s): named here.
ATTACHED_IN_FUNCTIONS = {
    ("serve.lora", "POST", "/v1/load_lora_adapter"),
    ("serve.lora", "POST", "/v1/unload_lora_adapter"),
    ("cohere", "POST", "/cohere/v2/chat"),
    ("cohere", "POST", "/cohere/v2/chat/render"),
    ("serve.sagemaker", "POST", "/invocations"),
    ("serve.sagemaker", "GET", "/ping"),
    ("serve.sagemaker", "POST", "/ping"),
}
# Admin (the controller's facade): the RL router, the dev routers, the serving-ops routers.
ADMIN_PACKAGES = (
    "rl.",
    "serve.dev.",
    "serve.lora",
    "serve.profile",
    "serve.elastic_ep",
    "serve.fault_tolerance",
    "serve.instrumentator.basic",
)
# Answered on both sides by what each is: a probe and the model list.
BOTH = {("GET", "/health"), ("GET", "/v1/models")}
# SageMaker's health probe: a deployment platform's, not a trainer's; the gateway's /health is the probe.
NOT_ANSWERED = {("GET", "/ping"), ("POST", "/ping")}


def vllm_routes() -> set[tuple[str, str, str]]:
    """(router, method, path) for every route of vLLM's routers."""
    import vllm.entrypoints as vllm_entrypoints
    from fastapi import APIRouter

    found = set(ATTACHED_IN_FUNCTIONS)
    for info in pkgutil.walk_packages(vllm_entrypoints.__path__, "vllm.entrypoints."):
        if not info.name.endswith(("api_router", "instrumentator.basic", "instrumentator.health")):
            continue
        module = importlib.import_module(info.name)
        router_name = info.name.removeprefix("vllm.entrypoints.").removesuffix(".api_router")
        for value in vars(module).values():
            if isinstance(value, APIRouter):
                for route in value.routes:
                    # A websocket (speech-to-text's `/v1/realtime`) is an upgraded GET.
                    methods = getattr(route, "methods", None) or {"GET"}
                    found |= {(router_name, method, route.path) for method in methods}  # type: ignore[attr-defined]
    return found


def admin_and_inference() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    admin, inference = set(), set()
    for router, method, path in vllm_routes():
        if (method, path) in BOTH | NOT_ANSWERED:
            continue
        (admin if router.startswith(ADMIN_PACKAGES) else inference).add((method, path))
    return admin, inference


def test_every_vllm_route_has_an_answer_on_one_side() -> None:
    from rlcp.controlplane.api.openapi import ROUTES as CONTROLLER_ROUTES
    from rlcp.controlplane.gateway.app import ROUTES as GATEWAY_ROUTES

    admin, inference = admin_and_inference()
    assert ("POST", "/collective_rpc") in admin and ("POST", "/v1/chat/completions/render") in inference
    facade = {(r.method, r.path) for r in CONTROLLER_ROUTES}
    gateway = {(r.method, r.path) for r in GATEWAY_ROUTES}
    assert not admin - facade, f"vLLM admin routes the facade leaves a bare 404: {sorted(admin - facade)}"
    assert not inference - gateway, f"vLLM inference routes the gateway does not know: {sorted(inference - gateway)}"
    assert BOTH <= facade and BOTH <= gateway
    # Each documented, route by route, in the table of docs/controller.md.
    table = (Path(__file__).parents[3] / "docs" / "controller.md").read_text()
    missing = sorted(f"{m} {p}" for m, p in admin | inference | BOTH if f"`{m} {p}`" not in table)
    assert not missing, f"vLLM routes missing from docs/controller.md's table: {missing}"


# -- the facade: each admin route with its fleet meaning ---------------------------------------
def _meanings(ckpt: Path) -> dict[tuple[str, str], tuple[str, Any, int, Any]]:
    """(method, path) -> (path with query, body, status, answer or None to check the status only),
    in an order that leaves the fleet serving: pause before resume, sleep before wake."""
    return {
        ("POST", "/pause"): ("/pause?mode=keep", None, 200, {"status": "paused"}),
        ("GET", "/is_paused"): ("/is_paused", None, 200, {"is_paused": True}),
        ("POST", "/resume"): ("/resume", None, 200, {"status": "resumed"}),
        ("POST", "/sleep"): ("/sleep?level=1&mode=wait", None, 200, {"status": "sleeping", "level": 1}),
        ("GET", "/is_sleeping"): ("/is_sleeping", None, 200, {"is_sleeping": True}),
        ("POST", "/wake_up"): ("/wake_up", None, 200, {"status": "awake", "tags": None}),
        ("POST", "/update_weights"): ("/update_weights", {"weight_dir": str(ckpt)}, 200, None),
        ("POST", "/collective_rpc"): (
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(ckpt)}},
            200,
            {"results": [None, None]},
        ),
        ("POST", "/reset_prefix_cache"): ("/reset_prefix_cache", None, 200, {"success": True}),
        ("POST", "/update_weight_version"): (
            "/update_weight_version",
            {"new_version": "named"},
            200,
            {"success": True, "new_version": "named"},
        ),
        ("GET", "/weight_info"): ("/weight_info", None, 200, {"weight_version": "named"}),
        ("GET", "/get_world_size"): ("/get_world_size", None, 200, {"world_size": 2}),
        ("GET", "/server_info"): ("/server_info?config_format=json", None, 200, None),
        # The broadcast's steps: init needs the trainer's group; without one, start is the 409 that says so.
        ("POST", "/init_weight_transfer_engine"): ("/init_weight_transfer_engine", {}, 422, None),
        ("POST", "/start_weight_update"): ("/start_weight_update", None, 409, None),
        ("POST", "/finish_weight_update"): ("/finish_weight_update", None, 409, None),
        ("POST", "/shutdown_weight_transfer_engine"): ("/shutdown_weight_transfer_engine", None, 200, None),
        ("POST", "/v1/load_lora_adapter"): (
            "/v1/load_lora_adapter",
            {"lora_name": "a", "lora_path": "/etc"},
            403,
            None,
        ),
        ("POST", "/v1/unload_lora_adapter"): ("/v1/unload_lora_adapter", {"lora_name": "none"}, 404, None),
    }


async def test_each_admin_route_answers_its_fleet_meaning_or_its_501(sim_fleet, tmp_path: Path) -> None:
    from rlcp.controlplane.api.unsupported import REFUSED

    ctl, agents = sim_fleet
    ckpt = write_checkpoint(tmp_path / "step-1", 1)
    meanings = _meanings(ckpt)
    refused = {(m, p) for m, p, _ in REFUSED}
    admin, _ = admin_and_inference()
    assert not admin - set(meanings) - refused, sorted(admin - set(meanings) - refused)
    assert not set(meanings) & refused
    for key, (path, body, status, answer) in meanings.items():
        got_status, got = await ctl.call(key[0], path, body)
        assert got_status == status, (key, got)
        if answer is not None:
            assert got == answer, (key, got)
        if got_status >= 400:
            assert set(got) == {"error"} and got["error"]["message"], (key, got)
    for method, path in sorted(admin & refused):
        status, body = await ctl.call(method, path, {} if method == "POST" else None)
        assert status == 501 and body["error"]["code"] == "not_supported", (path, body)
        assert f"{method} {path}" in body["error"]["message"] and body["error"]["field"] == path
    # Renamed weights: each agent is told the new desired version (the reconciler), then serves again.
    await wait_for(
        lambda: all(
            ctl.ctl.worker_view(r).serving and ctl.ctl.worker_view(r).weight_version == "named"
            for r in ctl.ctl.members()
        ),
        15,
        "every member serving the renamed weights",
    )


# -- the gateway: each inference route forwarded inside the fence, or its 501 -----------------
@pytest.fixture
def fleet_shape() -> FleetShape:
    return FleetShape(agents=2)


async def test_each_inference_route_is_forwarded_inside_the_fence_or_refused(gateway_fleet: GatewayFleet) -> None:
    from rlcp.controlplane.gateway.vllm_routes import FORWARDED, REFUSED

    fleet = gateway_fleet
    _, inference = admin_and_inference()
    forwarded = {("POST", p) for p, _ in FORWARDED}
    refused = {(m, p): why for m, p, why in REFUSED}
    assert inference <= forwarded | set(refused)
    ids = {a.agent_id for a in fleet.agents}
    for _, path in sorted(forwarded):
        async with fleet.http.post(
            f"{fleet.gateway.url}{path}", json={"model": "sim", "prompt": "hi", "max_tokens": 1}
        ) as resp:
            # The worker's own answer (the sim engine serves completions only: a 404 for the rest),
            # from a member inside the fence, at the fleet's version.
            assert resp.headers.get("X-RL-Worker") in ids, (path, resp.status, await resp.text())
            assert resp.headers.get("X-RL-Weight-Version") == "default", path
            assert resp.status == (200 if path == "/v1/completions" else 404), (path, await resp.text())
    for (method, path), why in sorted(refused.items()):
        url = f"{fleet.gateway.url}{path.replace('{response_id}', 'resp-1')}"
        async with fleet.http.request(method, url, json={}) as resp:
            body = await resp.json()
            assert resp.status == 501 and body["error"]["code"] == "not_supported", (path, body)
            assert why in body["error"]["message"] and "X-RL-Worker" not in resp.headers
    async with fleet.http.post(f"{fleet.gateway.url}/v1/chat/completions/renderer", json={}) as resp:
        body = await resp.json()
        assert resp.status == 404 and "/v1/chat/completions/renderer" in body["error"]["message"], body

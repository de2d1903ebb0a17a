"""The `vllm` driver on the wire, for the fault shapes a stock `vllm serve` cannot be made to
produce on demand (a dead engine core behind a live API server, slow answers, a refused cache
reset, an older vLLM) and the rounds of its disk update. Everything the server does produce is
tested against two real servers in vllm_serve/.

aioresponses stands in for the workers; the session, HttpTransport and tenacity are real.
An unmocked request fails as a connection error, so a call a flavor should not make
shows up as a failure, not as silence (the `wire` and `session` fixtures: conftest.py).
"""

from __future__ import annotations

import pytest
from aioresponses import aioresponses

from rlcp.controlplane.workers.capabilities import LoadReport, capabilities
from rlcp.controlplane.workers.transport import (
    WorkerRejected,
    WorkerTimeout,
)
from tests.controlplane.workers.flavors.wire import BASE, make, sent, slow

# -- vllm ----------------------------------------------------------------------------------
# Only fault shapes a stock `vllm serve` cannot be made to produce on demand (a 503 from a dead
# engine core behind a live API server, slow answers, a refused cache reset, an older vLLM).
# Everything it does produce is tested against two real servers in vllm_serve/. beside this file.
MODELS = {
    "object": "list",
    "data": [
        {"id": "tiny", "object": "model", "root": "/m/base", "parent": None, "max_model_len": 512},
        {"id": "sql", "object": "model", "root": "/m/sql", "parent": "tiny", "max_model_len": 512},
    ],
}


def mock_vllm_reads(m: aioresponses, *, health: int = 200, paused_status: int = 200) -> None:
    m.get(f"{BASE}/health", status=health, body="", repeat=True)
    m.get(
        f"{BASE}/is_paused",
        status=paused_status,
        payload={"is_paused": True} if paused_status == 200 else {"error": "Failed to fetch pause status: engine dead"},
        repeat=True,
    )
    m.get(f"{BASE}/weight_info", payload={"weight_version": "v7"})
    m.get(f"{BASE}/v1/models", payload=MODELS)
    m.get(f"{BASE}/get_world_size", payload={"world_size": 4})


async def test_vllm_dead_engine_is_reported_not_raised(session, wire):
    mock_vllm_reads(wire, health=503, paused_status=500)
    status = await make("vllm", session).status()
    assert status.engine_alive is False and status.ready is False and "engine dead" in status.not_ready_reason


async def test_vllm_failed_read_with_live_engine_raises(session, wire):
    mock_vllm_reads(wire, paused_status=500)
    with pytest.raises(WorkerRejected) as err:
        await make("vllm", session).status()
    assert err.value.status == 500 and "engine dead" in err.value.reason


async def test_vllm_pause_and_resume(session, wire):
    wire.post(f"{BASE}/pause?mode=wait", callback=slow(0.7, {"status": "paused"}))
    wire.post(f"{BASE}/resume", payload={"status": "resumed"})
    api = make("vllm", session)
    await api.pause("wait", 0.2)  # answers after the 0.5 s default: the deadline is timeout_s + grace
    await api.resume()
    assert sent(wire) == [("POST", f"{BASE}/pause?mode=wait", None), ("POST", f"{BASE}/resume", None)]


async def test_vllm_reload_uses_the_weight_load_deadline(session, wire):
    wire.post(f"{BASE}/collective_rpc", callback=slow(0.7), repeat=True)
    wire.post(f"{BASE}/update_weight_version", payload={"success": True, "new_version": "v8"})
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": True})
    await make("vllm", session, weight_load_timeout_s=2.0).update_weights_from_disk("/w", "v8")  # > 0.5 default
    wire.requests.clear()
    with pytest.raises(WorkerTimeout):
        await make("vllm", session, weight_load_timeout_s=0.05).update_weights_from_disk("/w", "v8")
    assert [u for _, u, _ in sent(wire)] == [f"{BASE}/collective_rpc"]  # not retried, no version set


async def test_vllm_cache_reset_refused_is_an_error(session, wire):
    wire.post(
        f"{BASE}/v1/load_lora_adapter",
        body="Success: LoRA adapter 'sql' added successfully.",
        content_type="text/plain",
    )
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": False}, repeat=True)
    with pytest.raises(WorkerRejected) as err:
        await make("vllm", session).load_lora("sql", "/m/sql", "2")
    assert err.value.status == 200 and "success=false" in err.value.reason
    assert sent(wire)[0] == (
        "POST",
        f"{BASE}/v1/load_lora_adapter",
        {"lora_name": "sql", "lora_path": "/m/sql", "load_inplace": True},
    )
    assert len(sent(wire)) == 2


async def test_vllm_unload_and_its_404(session, wire):
    wire.post(f"{BASE}/v1/unload_lora_adapter", body="Success", content_type="text/plain")
    wire.post(
        f"{BASE}/v1/unload_lora_adapter",
        status=404,
        payload={"error": {"message": "The lora adapter 'sql' cannot be found.", "type": "NotFoundError", "code": 404}},
    )
    api = make("vllm", session)
    await api.unload_lora("sql")
    await api.unload_lora("sql")  # already gone: still fine
    assert sent(wire) == [("POST", f"{BASE}/v1/unload_lora_adapter", {"lora_name": "sql"})] * 2


async def test_vllm_without_the_weight_checker_verifies_by_version_only(session, wire):
    # vLLM releases before the RL router's /weight_checker answer 404 (0.32 has it).
    wire.post(f"{BASE}/weight_checker", status=404, payload={"detail": "Not Found"})
    assert await make("vllm", session).weight_checksums() is None
    assert sent(wire) == [("POST", f"{BASE}/weight_checker", {"action": "checksum"})]


async def test_vllm_takes_no_desired_version(session):
    assert "desired_version" not in capabilities(make("vllm", session))  # stock vLLM cannot gate readiness


async def test_vllm_takes_the_disk_update_in_four_rounds_its_load_answering_version_and_checksums(session, wire):
    wire.post(f"{BASE}/pause?mode=keep", payload={"status": "paused"})
    wire.post(f"{BASE}/collective_rpc", payload={})
    wire.post(f"{BASE}/update_weight_version", payload={"success": True, "new_version": "v8"})
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": True})
    wire.post(f"{BASE}/weight_checker", payload={"checksums": {"model.w": "ab"}})
    wire.post(f"{BASE}/resume", payload={"status": "resumed"})
    api = make("vllm", session)
    assert api.loads_with_checksums is True
    assert await api.pause_for_update("v8", "keep", 1.0, weights_path="/w") is None  # cannot check it again
    # The reload, then the version, the cache reset and the checksums at once (one round).
    assert await api.load_from_disk("/w", "v8", checksums=True) == LoadReport("v8", {"model.w": "ab"})
    assert await api.resume_after_update() is None
    calls = sent(wire)
    assert calls[:2] == [
        ("POST", f"{BASE}/pause?mode=keep", None),
        ("POST", f"{BASE}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": "/w"}}),
    ]
    assert sorted(calls[2:5]) == [
        ("POST", f"{BASE}/reset_prefix_cache?reset_running_requests=true", None),
        ("POST", f"{BASE}/update_weight_version", {"new_version": "v8"}),
        ("POST", f"{BASE}/weight_checker", {"action": "checksum"}),
    ]
    assert calls[5:] == [("POST", f"{BASE}/resume", None)]


async def test_vllm_load_without_checksums_does_not_hash(session, wire):
    wire.post(f"{BASE}/collective_rpc", payload={})
    wire.post(f"{BASE}/update_weight_version", payload={"success": True, "new_version": "v8"})
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": True})
    assert await make("vllm", session).load_from_disk("/w", "v8", checksums=False) == LoadReport("v8", None)
    assert len(sent(wire)) == 3

"""The `agent` driver on the wire: what it sends, how it reads the agent's answers, and how
failures map onto the WorkerCallError taxonomy (retried or not).

aioresponses stands in for the workers; the session, HttpTransport and tenacity are real.
An unmocked request fails as a connection error, so a call a flavor should not make
shows up as a failure, not as silence (the `wire` and `session` fixtures: conftest.py).
"""

from __future__ import annotations

import aiohttp
import pytest
from yarl import URL

from rlcp.controlplane.workers.capabilities import LoadReport, UpdatePlan
from rlcp.controlplane.workers.transport import (
    WorkerRejected,
    WorkerTimeout,
    WorkerUnreachable,
)
from rlcp.core.wire.agent.state import RequestCounts
from tests.controlplane.workers.flavors.wire import BASE, make, sent, slow

# -- agent ---------------------------------------------------------------------------------
AGENT_STATE = {
    "agent_id": "w0",
    "instance_id": "3f2a",
    "model": "tiny",
    "engine": "vllm",
    "engine_alive": True,
    "ready": False,
    "not_ready_reason": "weight version v1 differs from desired v2",
    "paused": True,
    "requests": {"running": 1, "waiting": 2, "frozen": 3},
    "weight_version": "v1",
    "desired_weight_version": "v2",
    "world_size": 2,
    "loras": [{"name": "sql", "version": "3", "path": "/m/sql", "adapter_id": 1, "loaded_at": "2025-01-01T00:00:00Z"}],
}


async def test_agent_status_reads_the_state_document(session, wire):
    wire.get(f"{BASE}/v1/agent/state", payload=AGENT_STATE)
    status = await make("agent", session).status()
    assert status.paused is True and status.weight_version == "v1" and status.world_size == 2
    assert status.requests == RequestCounts(running=1, waiting=2, frozen=3)
    assert status.loras == {"sql": "3"}
    assert status.ready is False and status.not_ready_reason.startswith("weight version v1")
    assert status.engine_alive is True and status.instance_id == "3f2a"
    (call,) = wire.requests[("GET", URL(f"{BASE}/v1/agent/state"))]
    assert call.kwargs["headers"] == {"Authorization": "Bearer tok"}


async def test_agent_malformed_state_is_rejected_without_retry(session, wire):
    wire.get(f"{BASE}/v1/agent/state", payload={"paused": "maybe"}, repeat=True)
    with pytest.raises(WorkerRejected) as err:
        await make("agent", session).status()
    assert err.value.status == 200 and "malformed state" in err.value.reason
    assert len(sent(wire)) == 1


async def test_agent_pause_sends_mode_and_timeout_and_waits_past_the_call_default(session, wire):
    # The answer comes after the policy's 0.5 s default: the pause deadline is timeout_s + grace.
    wire.post(f"{BASE}/pause?mode=keep&timeout_s=0.2", callback=slow(0.7, {"status": "paused"}))
    await make("agent", session).pause("keep", 0.2)
    assert sent(wire) == [("POST", f"{BASE}/pause?mode=keep&timeout_s=0.2", None)]


async def test_agent_mutations_send_the_documented_bodies(session, wire):
    for path in ("/resume", "/v1/agent/weights/disk", "/v1/agent/loras", "/weight_checker"):
        wire.post(BASE + path, payload={"checksums": {"w": "abc"}})
    wire.put(f"{BASE}/v1/agent/desired", payload=AGENT_STATE, repeat=True)
    api = make("agent", session)
    await api.resume()
    await api.update_weights_from_disk("/w/step-2", "v2")
    await api.load_lora("sql", "/m/sql", None)
    await api.set_desired_version("v2")
    await api.set_desired_version(None)
    assert await api.weight_checksums() == {"w": "abc"}
    assert sent(wire) == [
        ("POST", f"{BASE}/resume", None),
        ("POST", f"{BASE}/v1/agent/weights/disk", {"path": "/w/step-2", "version": "v2"}),
        ("POST", f"{BASE}/v1/agent/loras", {"name": "sql", "path": "/m/sql", "version": None}),
        ("PUT", f"{BASE}/v1/agent/desired", {"weight_version": "v2"}),
        ("PUT", f"{BASE}/v1/agent/desired", {"weight_version": None}),
        ("POST", f"{BASE}/weight_checker", {"action": "checksum"}),
    ]


async def test_agent_takes_each_disk_update_step_in_one_call_that_answers_a_read(session, wire):
    wire.post(f"{BASE}/v1/agent/prepare", payload=AGENT_STATE)
    wire.post(
        f"{BASE}/v1/agent/weights/disk",
        payload={"status": "updated", "weight_version": "v2", "checksums": {"model.w": "ab"}},
    )
    wire.post(f"{BASE}/v1/agent/resume", payload=AGENT_STATE | {"paused": False})
    api = make("agent", session)
    assert api.loads_with_checksums is True
    assert (await api.pause_for_update("v2", "keep", 1.0, weights_path="/w")).paused is True
    assert await api.load_from_disk("/w", "v2", checksums=True) == LoadReport("v2", {"model.w": "ab"})
    assert (await api.resume_after_update()).paused is False
    assert sent(wire) == [
        (
            "POST",
            f"{BASE}/v1/agent/prepare",
            {"desired_weight_version": "v2", "mode": "keep", "timeout_s": 1.0, "weights_path": "/w"},
        ),
        ("POST", f"{BASE}/v1/agent/weights/disk", {"path": "/w", "version": "v2", "checksums": True}),
        ("POST", f"{BASE}/v1/agent/resume", None),
    ]


async def test_agent_takes_the_disk_update_in_one_call(session, wire):
    answer = {
        "status": "updated",
        "weight_version": "v2",
        "checksums": {"model.w": "ab"},
        "resumed": True,
        "held_back": None,
        "state": AGENT_STATE | {"paused": False, "weight_version": "v2"},
    }
    wire.post(f"{BASE}/v1/agent/weights/update", payload=answer)
    api = make("agent", session)
    plan = UpdatePlan(
        path="/w",
        version="v2",
        mode="keep",
        pause_timeout_s=1.0,
        checksums=True,
        resume=True,
        expected_checksums={"model.w": "ab"},
    )
    report = await api.update_in_one_call(plan)
    assert report.load == LoadReport("v2", {"model.w": "ab"}) and report.resumed and report.held_back is None
    assert (report.status.paused, report.status.weight_version) == (False, "v2")
    assert sent(wire) == [
        (
            "POST",
            f"{BASE}/v1/agent/weights/update",
            {
                "path": "/w",
                "version": "v2",
                "mode": "keep",
                "timeout_s": 1.0,
                "checksums": True,
                "resume": True,
                "expected_checksums": {"model.w": "ab"},
            },
        )
    ]


async def test_an_agent_older_than_the_one_call_update_gets_the_three_calls(session, wire):
    """A rolling upgrade of the agents: the three calls an older agent takes, the expected
    checksums then held to here -- they disagree, so it is not resumed."""
    plan = UpdatePlan(
        path="/w",
        version="v2",
        mode="keep",
        pause_timeout_s=1.0,
        checksums=True,
        resume=True,
        expected_checksums={"model.w": "ab"},
    )
    api = make("agent", session)
    wire.post(f"{BASE}/v1/agent/weights/update", status=404, payload={"error": {"code": "not_found", "message": "x"}})
    wire.post(f"{BASE}/v1/agent/prepare", payload=AGENT_STATE)
    wire.post(
        f"{BASE}/v1/agent/weights/disk",
        payload={"status": "updated", "weight_version": "v2", "checksums": {"model.w": "cd"}},
    )
    wire.get(f"{BASE}/v1/agent/state", payload=AGENT_STATE | {"weight_version": "v2"})
    report = await api.update_in_one_call(plan)
    assert not report.resumed and "1 of 1 tensors differ (model.w)" in (report.held_back or "")
    assert [(m, u) for m, u, _ in sent(wire)] == [
        ("POST", f"{BASE}/v1/agent/weights/update"),
        ("POST", f"{BASE}/v1/agent/prepare"),
        ("POST", f"{BASE}/v1/agent/weights/disk"),
        ("GET", f"{BASE}/v1/agent/state"),
    ]


async def test_agent_disk_update_uses_the_weight_load_deadline(session, wire):
    wire.post(f"{BASE}/v1/agent/weights/disk", callback=slow(0.7), repeat=True)
    await make("agent", session, weight_load_timeout_s=2.0).update_weights_from_disk("/w", "v2")  # > 0.5 default
    with pytest.raises(WorkerTimeout):
        await make("agent", session, weight_load_timeout_s=0.05).update_weights_from_disk("/w", "v2")


async def test_agent_unload_escapes_the_name_and_treats_404_as_done(session, wire):
    wire.delete(
        f"{BASE}/v1/agent/loras/org%2Fsql",
        status=404,
        payload={"error": {"code": "not_found", "message": "no LoRA named 'org/sql' is loaded"}},
    )
    await make("agent", session).unload_lora("org/sql")
    assert sent(wire) == [("DELETE", f"{BASE}/v1/agent/loras/org%2Fsql", None)]


async def test_agent_unload_500_is_retried_then_rejected(session, wire):
    wire.delete(
        f"{BASE}/v1/agent/loras/sql",
        status=500,
        payload={"error": {"code": "internal", "message": "boom"}},
        repeat=True,
    )
    with pytest.raises(WorkerRejected) as err:
        await make("agent", session).unload_lora("sql")
    assert err.value.status == 500 and "boom" in err.value.reason
    assert len(sent(wire)) == 3


async def test_agent_400_is_not_retried(session, wire):
    wire.post(
        f"{BASE}/v1/agent/loras",
        status=400,
        payload={"error": {"code": "bad_request", "message": "no dir"}},
        repeat=True,
    )
    with pytest.raises(WorkerRejected) as err:
        await make("agent", session).load_lora("sql", "/nope", "1")
    assert err.value.status == 400 and len(sent(wire)) == 1


async def test_agent_connection_error_is_unreachable_after_retries(session, wire):
    wire.post(f"{BASE}/resume", exception=aiohttp.ClientConnectionError("refused"), repeat=True)
    with pytest.raises(WorkerUnreachable):
        await make("agent", session).resume()
    assert len(sent(wire)) == 3


async def test_agent_status_read_is_not_retried(session, wire):
    # The poller's next read is the retry; a dead worker costs one deadline per poll.
    wire.get(f"{BASE}/v1/agent/state", exception=aiohttp.ClientConnectionError("refused"), repeat=True)
    with pytest.raises(WorkerUnreachable):
        await make("agent", session).status()
    assert len(sent(wire)) == 1


async def test_agent_slow_answer_is_a_timeout(session, wire):
    wire.get(f"{BASE}/v1/agent/state", callback=slow(2.0, AGENT_STATE), repeat=True)
    with pytest.raises(WorkerTimeout):
        await make("agent", session).status()


async def test_agent_weight_transfer_bodies(session, wire):
    for path in ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update"):
        wire.post(BASE + path, payload={"message": "ok"})
    api = make("agent", session)
    await api.init_weight_transfer({"master_port": 29500, "rank_offset": 1}, 5.0)
    await api.start_weight_update()
    await api.update_weights({"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}, 5.0)
    await api.finish_weight_update("v3")
    assert sent(wire) == [
        ("POST", f"{BASE}/init_weight_transfer_engine", {"init_info": {"master_port": 29500, "rank_offset": 1}}),
        ("POST", f"{BASE}/start_weight_update", None),
        (
            "POST",
            f"{BASE}/update_weights",
            {"update_info": {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}},
        ),
        ("POST", f"{BASE}/finish_weight_update", {"weight_version": "v3"}),
    ]

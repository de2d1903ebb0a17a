"""The `dynamo` driver on the wire: retries, liveness without probe routes, its disk update as
separate calls, the pause state its own calls left, reconcile reloads, and capabilities that
follow the routes a worker publishes. Against Dynamo's own software: test_dynamo.py.

aioresponses stands in for the workers; the session, HttpTransport and tenacity are real.
An unmocked request fails as a connection error, so a call a flavor should not make
shows up as a failure, not as silence (the `wire` and `session` fixtures: conftest.py).
"""

from __future__ import annotations

import pytest

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.workers.capabilities import capabilities
from rlcp.controlplane.workers.registry import make_driver
from rlcp.controlplane.workers.transport import (
    HttpTransport,
    WorkerRejected,
)
from rlcp.controlplane.workerspec import WorkerSpec
from tests.controlplane.workers.flavors.wire import BASE, GRACE_S, POLICY, make, sent


# -- dynamo --------------------------------------------------------------------------------
# Dynamo's real answers (version shape, an error inside a 200, the route bodies, /health) are
# proven against Dynamo 1.6.1's own worker in tests/controlplane/workers/flavors/test_dynamo.py. Only what that
# software cannot be made to produce stays here.
async def test_dynamo_500_is_retried_then_rejected(session, wire):
    wire.post(f"{BASE}/engine/resume_generation", status=500, body="internal", content_type="text/plain", repeat=True)
    with pytest.raises(WorkerRejected) as err:
        await make("dynamo", session).resume()
    assert err.value.status == 500 and len(sent(wire)) == 3


async def test_dynamo_without_probe_routes_has_unknown_liveness(session, wire):
    # An older system port: no liveness_probe, no /health (Dynamo 1.6.1 has both).
    wire.post(f"{BASE}/engine/get_weight_version", payload={"status": "ok", "version": None, "version_declared": False})
    wire.post(f"{BASE}/engine/liveness_probe", status=404, body="not found", content_type="text/plain")
    wire.get(f"{BASE}/health", status=404, body="not found", content_type="text/plain")
    status = await make("dynamo", session).status()
    assert status.engine_alive is None and status.ready is None and status.weight_version is None


async def test_dynamo_dead_engine_is_not_ready(session, wire):
    # What Dynamo's liveness_probe answers when the engine check fails; a CPU engine here
    # cannot be made to fail its health check without killing the worker.
    wire.post(f"{BASE}/engine/get_weight_version", payload={"status": "ok", "version": "v5", "version_declared": True})
    wire.post(f"{BASE}/engine/liveness_probe", payload={"status": "error", "alive": False, "message": "dead"})
    wire.get(f"{BASE}/health", payload={"status": "ready"})
    status = await make("dynamo", session).status()
    assert status.engine_alive is False and status.ready is False and status.weight_version == "v5"


async def test_dynamo_takes_the_disk_update_steps_as_separate_calls(session, wire):
    for route in ("pause_generation", "update_weights_from_disk", "resume_generation"):
        wire.post(f"{BASE}/engine/{route}", payload={"status": "ok"})
    api = make("dynamo", session)
    assert await api.pause_for_update("v8", "keep", 1.0, weights_path="/w") is None
    assert await api.load_from_disk("/w", "v8", checksums=True) is None
    wire.post(f"{BASE}/engine/get_weight_version", payload={"status": "ok", "version": "v8", "version_declared": True})
    wire.post(f"{BASE}/engine/liveness_probe", payload={"status": "ok", "alive": True})
    wire.get(f"{BASE}/health", payload={"status": "ready"})
    # The resume answers a fresh status: the controller holds the new version before the
    # member serves again (a Dynamo worker cannot refuse a request sent for other weights).
    status = await api.resume_after_update()
    assert status.weight_version == "v8" and status.paused is False
    assert sent(wire)[:3] == [
        ("POST", f"{BASE}/engine/pause_generation", {"mode": "keep", "clear_cache": False}),
        ("POST", f"{BASE}/engine/update_weights_from_disk", {"model_path": "/w", "weight_version": "v8"}),
        ("POST", f"{BASE}/engine/resume_generation", {}),
    ]


async def test_dynamo_pause_state_is_what_the_drivers_own_calls_left(session, wire):
    # Dynamo has no pause read: a new worker (a new instance, so a new driver) starts
    # unpaused; a pause counts from the moment it is asked, a resume once it answered ok.
    for route in ("get_weight_version", "liveness_probe"):
        wire.post(
            f"{BASE}/engine/{route}",
            payload={"status": "ok", "version": "v1", "version_declared": True, "alive": True},
            repeat=True,
        )
    wire.get(f"{BASE}/health", payload={"status": "ready"}, repeat=True)
    wire.post(f"{BASE}/engine/pause_generation", payload={"status": "ok"})
    wire.post(f"{BASE}/engine/resume_generation", status=500, body="boom", content_type="text/plain", repeat=True)
    api = make("dynamo", session)
    assert (await api.status()).paused is False
    await api.pause("keep", 1.0)
    assert (await api.status()).paused is True
    with pytest.raises(WorkerRejected):
        await api.resume()
    assert (await api.status()).paused is True  # a failed resume leaves it paused, as far as anyone knows


async def test_dynamo_reconcile_reload_of_a_running_worker_pauses_it_first(session, wire):
    # Dynamo refuses a reload of a worker not paused through pause_generation (inside a 200,
    # seen in tests/e2e/test_dynamo_rollouts.py); the reconciler asks for the reload alone.
    for route in ("pause_generation", "update_weights_from_disk", "resume_generation"):
        wire.post(f"{BASE}/engine/{route}", payload={"status": "ok"})
    await make("dynamo", session).update_weights_from_disk("/w", "v9")
    assert sent(wire) == [
        ("POST", f"{BASE}/engine/pause_generation", {"mode": "abort", "clear_cache": False}),
        ("POST", f"{BASE}/engine/update_weights_from_disk", {"model_path": "/w", "weight_version": "v9"}),
        ("POST", f"{BASE}/engine/resume_generation", {}),
    ]


async def test_dynamo_failed_reconcile_reload_stays_paused(session, wire):
    wire.post(f"{BASE}/engine/pause_generation", payload={"status": "ok"})
    wire.post(f"{BASE}/engine/update_weights_from_disk", payload={"status": "error", "message": "no tensors"})
    api = make("dynamo", session)
    with pytest.raises(WorkerRejected, match="no tensors"):
        await api.update_weights_from_disk("/bad", "v9")
    assert [path for _, path, _ in sent(wire)] == [
        f"{BASE}/engine/pause_generation",
        f"{BASE}/engine/update_weights_from_disk",
    ]  # no resume
    wire.post(f"{BASE}/engine/update_weights_from_disk", payload={"status": "ok"})
    await api.update_weights_from_disk("/w", "v9")  # paused already: the reload alone
    assert sent(wire)[-1] == (
        "POST",
        f"{BASE}/engine/update_weights_from_disk",
        {"model_path": "/w", "weight_version": "v9"},
    )


def dynamo_with_routes(session, routes):
    spec = WorkerSpec(id="w0", admin_url=BASE, flavor="dynamo", routes=routes)
    transport = HttpTransport(session=session, worker_id="w0", base_url=BASE, token="tok", policy=POLICY)
    return make_driver(spec, transport, DriverDeadlines(weight_load_s=600.0, grace_s=GRACE_S))


async def test_dynamo_capabilities_follow_the_published_routes(session, wire):
    assert capabilities(make("dynamo", session)) == {"control", "disk_weights", "lora", "sleep"}  # none published
    without_lora = (
        "get_weight_version",
        "liveness_probe",
        "pause_generation",
        "resume_generation",
        "update_weights_from_disk",
        "flush_cache",
    )
    # Sleep is never in the published list (Dynamo's worker factory registers control/sleep itself).
    assert capabilities(dynamo_with_routes(session, without_lora)) == {"control", "disk_weights", "sleep"}
    assert capabilities(dynamo_with_routes(session, ("pause_generation", "load_lora", "unload_lora"))) == {
        "lora",
        "sleep",
    }
    assert capabilities(dynamo_with_routes(session, ())) == {"sleep"}
    assert sent(wire) == []


async def test_dynamo_has_no_broadcast_to_call(session, wire):
    api = dynamo_with_routes(
        session,
        (
            "init_weights_update_group",
            "update_weights_from_distributed",
            "destroy_weights_update_group",
            "pause_generation",
            "resume_generation",
        ),
    )
    assert capabilities(api) == {"control", "sleep"}  # Dynamo's group routes call engine RPCs vLLM lacks
    for name in ("init_weight_transfer", "start_weight_update", "update_weights", "finish_weight_update"):
        assert not hasattr(
            api, name
        )  # an operation that needs it is refused up front (tests/controlplane/operations/test_operations_memory.py)
    assert sent(wire) == []

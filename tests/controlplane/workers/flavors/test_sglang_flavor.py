"""The `sglang` driver on the wire: vLLM's weight-transfer calls translated onto SGLang's
group, a trainer it cannot join refused before SGLang is called, and a failed chunk ending the
session. SGLang's answers to them are checked against the real server in test_sglang.py.

aioresponses stands in for the workers; the session, HttpTransport and tenacity are real.
An unmocked request fails as a connection error, so a call a flavor should not make
shows up as a failure, not as silence (the `wire` and `session` fixtures: conftest.py).
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from rlcp.controlplane.reconcile.plan import plan
from rlcp.controlplane.workers.capabilities import capabilities
from rlcp.controlplane.workers.flavors.sglang import UNNAMED_WEIGHTS
from rlcp.controlplane.workers.transport import (
    WorkerRejected,
)
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.controller.desired import DesiredState, LoraSpec
from rlcp.harness.http import free_port
from tests.controlplane.workers.flavors.wire import BASE, make, sent


async def test_sglang_weight_transfer_is_vllms_calls_translated_onto_sglangs_group(session, wire):
    """What the `sglang` driver sends for each of vLLM's calls (SGLang's answers to them are checked
    against the real server in test_sglang.py, beside this file). The trainer's rendezvous is a real
    socket."""
    rendezvous = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = rendezvous.sockets[0].getsockname()[1]
    wire.post(
        f"{BASE}/destroy_weights_update_group",
        status=400,
        payload={"success": False, "message": "The group to be destroyed does not exist."},
    )
    for path in ("/init_weights_update_group", "/begin_weight_update", "/end_weight_update"):
        wire.post(BASE + path, payload={"success": True, "message": "ok"})
    wire.post(f"{BASE}/update_weights_from_distributed", payload={"success": True, "message": "ok"}, repeat=True)
    api = make("sglang", session)
    assert "broadcast" in capabilities(api) and api.transfer_wire == "sglang"
    try:
        init = {"master_address": "127.0.0.1", "master_port": port, "world_size": 3, "backend": "gloo"}
        await api.init_weight_transfer(init | {"rank_offset": 2}, 5.0)
    finally:
        rendezvous.close()
    await api.start_weight_update()
    await api.update_weights({"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 3]]}, 5.0)
    await api.finish_weight_update("v3")
    group = {"group_name": "weight_update_group"}
    assert sent(wire) == [
        ("POST", f"{BASE}/destroy_weights_update_group", group),
        ("POST", f"{BASE}/init_weights_update_group", init | group | {"rank_offset": 2}),
        ("POST", f"{BASE}/begin_weight_update", {}),
        (
            "POST",
            f"{BASE}/update_weights_from_distributed",
            {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2, 3]], "flush_cache": False}
            | group
            | {"abort_all_requests": False},
        ),
        (
            "POST",
            f"{BASE}/update_weights_from_distributed",
            {"names": [], "dtypes": [], "shapes": [], "flush_cache": True, "weight_version": "v3"}
            | group
            | {"abort_all_requests": False},
        ),
        ("POST", f"{BASE}/end_weight_update", {}),
    ]


async def test_sglang_refuses_a_vllm_wire_trainer_and_a_trainer_that_never_listens_without_calling_sglang(
    session, wire
):
    api = make("sglang", session)
    unused = free_port()
    with pytest.raises(WorkerRejected, match="does not take: buffer_size_bytes, timeout_s"):
        await api.init_weight_transfer(
            {"master_address": "127.0.0.1", "master_port": unused, "rank_offset": 1, "world_size": 2}
            | {"timeout_s": 5.0, "buffer_size_bytes": 64},
            5.0,
        )
    with pytest.raises(WorkerRejected, match="master_port, world_size missing or mistyped"):
        await api.init_weight_transfer({"master_address": "127.0.0.1", "master_port": "x", "rank_offset": 1}, 5.0)
    with pytest.raises(WorkerRejected, match="did not accept a connection in time"):
        wire.post(f"{BASE}/destroy_weights_update_group", payload={"success": True, "message": "ok"})
        init = {"master_address": "127.0.0.1", "master_port": unused, "rank_offset": 1, "world_size": 2}
        await api.init_weight_transfer(init, 0.5)
    assert [path for _, path, _ in sent(wire)] == [f"{BASE}/destroy_weights_update_group"]  # never the join
    with pytest.raises(WorkerRejected, match="no weight-update group joined"):
        await api.update_weights({"names": [], "dtype_names": [], "shapes": []}, 1.0)


async def test_sglang_chunk_that_failed_ends_the_session_and_withdraws_the_old_version(session, wire):
    """The operation calls no finish on a worker whose chunk failed; SGLang keeps what loaded, so the
    driver ends the session itself and names the weights as no version (what its status reads)."""
    api = make("sglang", session)
    api._group = "weight_update_group"  # joined (the join itself: the test above)
    wire.post(f"{BASE}/begin_weight_update", payload={"success": True, "message": "ok"})
    wire.post(
        f"{BASE}/update_weights_from_distributed",
        status=400,
        payload={"success": False, "message": "Failed to update parameter online: ... partially updated"},
    )
    wire.post(f"{BASE}/update_weights_from_distributed", payload={"success": True, "message": "ok"})
    wire.post(f"{BASE}/end_weight_update", payload={"success": True, "message": "ok"})
    await api.start_weight_update()
    with pytest.raises(WorkerRejected, match="partially updated"):
        await api.update_weights({"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}, 5.0)
    withdrawn = [body for _, path, body in sent(wire) if path.endswith("/update_weights_from_distributed")][-1]
    assert (withdrawn["names"], withdrawn["weight_version"], withdrawn["flush_cache"]) == ([], UNNAMED_WEIGHTS, True)
    assert sent(wire)[-1][1] == f"{BASE}/end_weight_update"
    info = {"weight_version": UNNAMED_WEIGHTS, "served_model_name": "tiny", "model_path": "/m/base"}
    wire.get(f"{BASE}/model_info", payload=info)
    wire.get(f"{BASE}/v1/loads", payload={"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})
    wire.get(f"{BASE}/v1/models", payload={"data": [{"id": "tiny", "parent": None}]})
    assert (await api.status()).weight_version is None


async def test_an_adapter_is_reported_with_the_version_it_was_loaded_as_so_the_reconciler_leaves_it(session, wire):
    """SGLang keeps no adapter versions. Reported as unknown, a desired adapter's version never
    matched, and the reconciler reloaded it (unload, then load) on every pass; the driver reports
    the version it loaded each adapter as, and forgets it on an unload."""
    api = make("sglang", session)

    async def status(root: str = "/w/sql") -> WorkerStatus:
        info = {"weight_version": "v1", "served_model_name": "tiny", "model_path": "/m/base"}
        wire.get(f"{BASE}/model_info", payload=info)
        wire.get(f"{BASE}/v1/loads", payload={"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})
        # SGLang's card of an adapter shows the path it was loaded from as `root`.
        cards = [{"id": "tiny", "parent": None}, {"id": "sql", "parent": "tiny", "root": root}]
        wire.get(f"{BASE}/v1/models", payload={"data": cards})
        return await api.status()

    desired = DesiredState(weight_version="v1", loras={"sql": LoraSpec(path="/w/sql", version="a1")})
    plan_of = functools.partial(plan, desired, told_desired=None, tracks_desired=False, worker_id="w0")
    unknown = await status()  # loaded by someone else (a controller before a restart): reloaded once
    assert unknown.loras == {"sql": None} and [a.kind for a in plan_of(unknown)] == ["load_lora"]
    wire.get(f"{BASE}/v1/models", payload={"data": [{"id": "tiny", "parent": None}]})
    wire.post(f"{BASE}/load_lora_adapter", payload={"success": True, "message": "ok"})
    await api.load_lora("sql", "/w/sql", "a1")
    loaded = await status()
    assert loaded.loras == {"sql": "a1"} and plan_of(loaded) == []
    # Another path under that name (loaded by someone else since): not the version this driver loaded.
    assert (await status(root="/w/other")).loras == {"sql": None}
    wire.post(f"{BASE}/unload_lora_adapter", payload={"success": True, "message": "ok"})
    await api.unload_lora("sql")
    assert (await status()).loras == {"sql": None}

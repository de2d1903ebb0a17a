"""rlctl's state table in an 80-column terminal keeps worker ids and versions whole and shows
the gateway (pure rendering: `rlcp.client.render`, no controller needed)."""

from __future__ import annotations

from rich.console import Console

from rlcp.client.render import state_view
from rlcp.core.wire.controller.state import FleetState

LONG_ID = "agent-rollout-pool-a-0017"
LONG_VERSION = "step-000123-20261123T0915"


def fleet_state() -> dict:
    worker = {
        "id": LONG_ID,
        "admin_url": "http://10.0.0.17:8101",
        "inference_url": "http://10.0.0.17:8100",
        "flavor": "agent",
        "world_size": 2,
        "reachable": True,
        "ready": True,
        "serving": True,
        "paused": False,
        "requests": {"running": 3, "waiting": 0, "frozen": 0},
        "weight_version": LONG_VERSION,
        "loras": {"sql-adapter": "7"},
        "last_result": {
            "worker_id": LONG_ID,
            "status": "error",
            "phase": "update",
            "message": "POST /v1/agent/weights/disk answered 500: the checkpoint lacks "
            "model.layers.3.mlp.down_proj.weight and 11 more tensors",
        },
    }
    return {
        "phase": "serving",
        "quiesced": False,
        "pause_state": "running",
        "requests": {"running": 3, "waiting": 0, "frozen": 0},
        "desired": {"weight_version": LONG_VERSION, "applied_versions": [LONG_VERSION]},
        "applied": {"weight_version": LONG_VERSION, "converged": True, "verified": True},
        "membership_epoch": 4,
        "discovery_synced": True,
        "last_operation": None,
        "gateway": {
            "url": "http://127.0.0.1:8090",
            "allowed_versions": [LONG_VERSION],
            "staleness_bound": 0,
            "held": 2,
            "routed": 901,
            "rejected": 1,
            "workers": [{"worker_id": LONG_ID, "in_fence": True, "in_flight": 3, "routed": 901, "failed": 0}],
        },
        "workers": [worker, {**worker, "id": LONG_ID.replace("0017", "0018"), "serving": False, "paused": True}],
    }


def test_ids_and_versions_stay_whole_at_80_columns() -> None:
    console = Console(width=80, record=True, color_system=None)
    console.print(state_view(FleetState.model_validate(fleet_state())))
    out = console.export_text()
    assert all(len(line) <= 80 for line in out.splitlines())
    assert LONG_ID in out and LONG_ID.replace("0017", "0018") in out
    assert out.count(LONG_VERSION) >= 3  # desired, applied and each worker's row
    assert "…" not in out.split("workers", 1)[1].split("last result")[0]  # no header cut either
    assert "serving +gw" in out and "paused" in out and "✗" in out
    assert f"{LONG_ID}: adapters sql-adapter@7" in out and "model.layers.3.mlp.down_proj.weight" in out
    assert "http://127.0.0.1:8090" in out and "routed 901" in out and "held 2" in out


def test_a_rolling_update_shows_its_wave_its_capacity_and_the_members_it_took_out() -> None:
    state = fleet_state()
    state["workers"][1] |= {"cordoned": True}
    state["update"] = {
        "operation_id": "3f2a9c1b04de",
        "status": "running",
        "version": LONG_VERSION,
        "progress": {
            "strategy": "rolling",
            "max_unavailable": 1,
            "waves": 4,
            "waves_done": 1,
            "wave": [LONG_ID],
            "updated": 1,
            "failed": 0,
        },
        "bubble": {
            "members": 4,
            "serving_at_start": 4,
            "min_serving": 3,
            "mean_capacity": 0.75,
            "worker_seconds_out": 3.2,
            "capacity": [{"t_s": 0, "serving": 4}, {"t_s": 0.1, "serving": 3}],
            "workers": [],
        },
    }
    console = Console(width=80, record=True, color_system=None)
    console.print(state_view(FleetState.model_validate(state)))
    out = console.export_text()
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "running, wave 2/4" in out and "min 3/4, mean 75%" in out and "updating" in out

"""Adapter versions as TRL's async trainer uses them, through the vLLM-shaped facade: one
adapter name per policy version, the new one loaded on every member before the old one is
unloaded. A load the members cannot hold (LoRA off, or past `max_loras`) is refused before any
worker is touched; a load no member took leaves the desired state as it was and the fleet
serving; one some members took never takes the others out of service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rlcp.harness.checkpoints import write_adapter
from rlcp.harness.controller import AUTH, Ctl, start_controller
from rlcp.harness.faults import Fault
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.touches import assert_no_worker_touched, fresh_request_id, with_request_id

pytestmark = pytest.mark.timeout(120)


async def _fleet(tmp_path: Path, **engine: Any) -> tuple[Ctl, list[SimAgent]]:
    settings = {"engine": {"kind": "sim", "model": "sim", **engine}}
    agents = [await SimAgent(f"w{i}", [tmp_path], settings_overrides=settings).start() for i in range(2)]
    ctl = await start_controller(tmp_path, agents)
    await ctl.wait_reachable()
    await ctl.wait_settled()
    return ctl, agents


@pytest.fixture
async def lora_fleet(request, tmp_path) -> AsyncIterator[tuple[Ctl, list[SimAgent]]]:
    ctl, agents = await _fleet(tmp_path, **getattr(request, "param", {}))
    yield ctl, agents
    await ctl.client.close()
    for a in agents:
        await a.stop()


def _held(agents: list[SimAgent]) -> list[list[str]]:
    return [sorted(lo.name for lo in a.service.state().loras) for a in agents]


async def _load(ctl: Ctl, name: str, root: Path, headers: dict[str, str] = AUTH) -> tuple[int, Any]:
    adapter = write_adapter(root / name)
    return await ctl.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter)}, headers)


async def _serving(ctl: Ctl) -> list[str]:
    state = await ctl.state()
    return sorted(w["id"] for w in state["workers"] if w["serving"])


@pytest.mark.parametrize("lora_fleet", [{"max_loras": 3}], indirect=True)
async def test_trl_order_load_new_then_unload_old_on_every_member(lora_fleet, tmp_path):
    ctl, agents = lora_fleet
    state = await ctl.state()
    assert all(w["max_loras"] == 3 and w["lora_enabled"] for w in state["workers"]), state["workers"]
    assert (await _load(ctl, "policy-v0", tmp_path))[0] == 200
    for k in range(1, 5):  # pause keep, load the new name, resume, unload the old one
        assert (await ctl.call("POST", "/pause?mode=keep"))[0] == 200
        status, body = await _load(ctl, f"policy-v{k}", tmp_path)
        assert status == 200, body
        assert (await ctl.call("POST", "/resume"))[0] == 200
        assert _held(agents) == [[f"policy-v{k - 1}", f"policy-v{k}"]] * 2
        status, body = await ctl.call("POST", "/v1/unload_lora_adapter", {"lora_name": f"policy-v{k - 1}"})
        assert status == 200, body
        assert _held(agents) == [[f"policy-v{k}"]] * 2
        assert await _serving(ctl) == ["w0", "w1"]
    assert sorted((await ctl.state())["desired"]["loras"]) == ["policy-v4"]


@pytest.mark.parametrize("lora_fleet", [{"max_loras": 2}], indirect=True)
async def test_a_load_past_max_loras_is_refused_before_any_call_naming_the_limit(lora_fleet, tmp_path):
    ctl, agents = lora_fleet
    assert (await _load(ctl, "a", tmp_path))[0] == 200
    assert (await _load(ctl, "b", tmp_path))[0] == 200
    rid = fresh_request_id("past-max-loras")
    status, body = await _load(ctl, "c", tmp_path, with_request_id(rid))
    assert status == 409 and body["error"]["field"] == "lora_name", body
    assert "max_loras=2" in body["error"]["message"], body
    assert_no_worker_touched(agents, rid)
    assert _held(agents) == [["a", "b"]] * 2
    # A new version of a name already held takes no more room.
    assert (await _load(ctl, "b", tmp_path))[0] == 200


@pytest.mark.parametrize("lora_fleet", [{"enable_lora": False}], indirect=True)
async def test_a_load_on_a_fleet_without_lora_is_a_4xx_before_any_call(lora_fleet, tmp_path):
    ctl, agents = lora_fleet
    rid = fresh_request_id("lora-off")
    status, body = await _load(ctl, "policy-v1", tmp_path, with_request_id(rid))
    assert status == 409, body
    assert "without LoRA" in body["error"]["message"] and sorted(body["error"]["workers"]) == ["w0", "w1"], body
    assert_no_worker_touched(agents, rid)
    state = await ctl.state()
    assert state["desired"]["loras"] == {} and await _serving(ctl) == ["w0", "w1"]


async def test_a_load_that_fails_on_every_member_leaves_the_fleet_as_it_was(lora_fleet, tmp_path):
    ctl, agents = lora_fleet
    for a in agents:
        a.faults.add("POST", "/v1/agent/loras", Fault("status", 422))
    status, body = await _load(ctl, "policy-v1", tmp_path)
    assert status == 502, body
    state = await ctl.state()
    assert state["desired"]["loras"] == {}, state["desired"]
    assert await _serving(ctl) == ["w0", "w1"], state["workers"]
    # A hot-swap that fails everywhere keeps the version that was desired.
    for a in agents:
        a.faults.clear()
    assert (await _load(ctl, "policy", tmp_path))[0] == 200
    for a in agents:
        a.faults.add("POST", "/v1/agent/loras", Fault("status", 422))
    status, body = await ctl.call(
        "POST", "/v1/rl/loras", {"name": "policy", "path": str(tmp_path / "policy"), "version": "v2"}
    )
    assert status == 502, body
    state = await ctl.state()
    assert {k: v["version"] for k, v in state["desired"]["loras"].items()} == {"policy": None}
    assert await _serving(ctl) == ["w0", "w1"]


async def test_a_load_that_fails_on_some_members_keeps_the_others_serving(lora_fleet, tmp_path):
    ctl, agents = lora_fleet
    agents[0].faults.add("POST", "/v1/agent/loras", Fault("status", 422, times=1))
    status, body = await _load(ctl, "policy-v1", tmp_path)
    assert status == 502 and list(body["error"]["workers"]) == ["w0"], body
    assert "policy-v1" in (await ctl.state())["desired"]["loras"]
    assert _held(agents)[1] == ["policy-v1"]
    assert "w1" in await _serving(ctl)
    # The failed one is converged by the reconciler, then serves again.
    await wait_for(lambda: _held(agents)[0] == ["policy-v1"], timeout_s=30, what="w0 converged to the adapter")

    async def both_serving() -> bool:
        return await _serving(ctl) == ["w0", "w1"]

    await wait_for(both_serving, timeout_s=30, what="both members serving")

"""The agent's parts by role, on a real SimEngine with no HTTP in between: the gate (one
mutating operation at a time, a deadline on every engine call), the records, the transfer
protocol's order, and the LoRA registry's ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.errors import DeadlineError, EngineCallError, EngineDeadError
from rlcp.agent.operations.transfer import TransferState
from rlcp.agent.records import KEPT
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings
from rlcp.core.errors import ConflictError
from rlcp.core.wire.agent.lora import LoraLoadRequest
from rlcp.harness.checkpoints import write_adapter

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[AgentService]:
    engine = SimEngine(model_name="sim", token_interval_s=0.001)
    await engine.start()
    settings = AgentSettings(
        agent_id="a0", engine={"kind": "sim", "model": "sim"}, allowed_roots=[tmp_path], admin={"token": "t"}
    )
    service = AgentService(engine, settings)
    await service.start()
    yield service
    await engine.shutdown()


def sim(agent: AgentService) -> SimEngine:
    assert isinstance(agent.engine, SimEngine)
    return agent.engine


async def wait_busy(agent: AgentService, kind: str) -> None:
    async with asyncio.timeout(10):
        while agent.gate.busy_with != kind:
            await asyncio.sleep(0.002)


# -- the gate ---------------------------------------------------------------------------------
async def test_a_second_mutating_operation_is_refused_naming_the_first_and_leaves_no_record(agent, tmp_path):
    sim(agent).hang_next("pause")
    pause = asyncio.create_task(agent.control.pause("keep", timeout_s=1.0))
    await wait_busy(agent, "pause")
    adapter = write_adapter(tmp_path / "adapter")
    for refused in (
        agent.control.resume(),
        agent.lora.load(LoraLoadRequest(name="a", path=str(adapter))),
        agent.weights.set_version("v9"),
        agent.transfer.init({}),
    ):
        with pytest.raises(ConflictError, match="^operation pause is running; retry when it is done$"):
            await refused
    # Reads answer meanwhile, from what the agent keeps; a checksum read takes no gate.
    assert agent.state().busy_with == "pause" and agent.state().last_operations == []
    assert await agent.weights.checksums()
    with pytest.raises(DeadlineError):
        await pause
    assert agent.gate.busy_with is None and not agent.paused  # the engine says it never paused
    await agent.control.resume()  # the gate is free again
    assert [(op.kind, op.status) for op in agent.state().last_operations] == [("resume", "ok"), ("pause", "timeout")]


async def test_engine_calls_are_mapped_to_the_agents_errors_and_recorded(agent):
    engine = sim(agent)
    agent.timeouts.control_s = 0.05
    engine.hang_next("resume")
    with pytest.raises(DeadlineError, match=r"^resume did not finish within 0.05s$"):
        await agent.control.resume()
    engine.fail_next("reset_weights", "checker exploded")
    with pytest.raises(EngineCallError, match=r"^reset_weights failed: checker exploded$"):
        await agent.weights.reset_checker()
    await agent.weights.set_version("v2")
    records = agent.state().last_operations
    assert [(r.kind, r.status) for r in records] == [
        ("update_weight_version", "ok"),
        ("weight_checker", "error"),
        ("resume", "timeout"),
    ]
    assert records[1].message == "reset_weights failed: checker exploded"
    metrics = agent.metrics.render(paused=False, ready=True, requests=engine.request_counts()).decode()
    assert 'rl_agent_operations_total{kind="resume",status="timeout"} 1.0' in metrics
    assert 'rl_agent_operations_total{kind="weight_checker",status="error"} 1.0' in metrics


async def test_a_dead_engine_is_not_called(agent):
    engine = sim(agent)
    engine.kill()
    with pytest.raises(EngineDeadError):
        await agent.control.pause("abort")
    assert agent.state().last_operations[0].status == "error" and agent.readiness.not_ready_reason() == (
        "engine is not alive"
    )


async def test_an_operation_cancelled_midway_is_recorded_cancelled_not_ok(agent):
    engine = sim(agent)
    engine.hang_next("pause")
    pause = asyncio.create_task(agent.control.pause("keep", timeout_s=30.0))
    await wait_busy(agent, "pause")
    pause.cancel()  # the caller went away (a dropped HTTP request) or the agent is stopping
    with pytest.raises(asyncio.CancelledError):
        await pause
    record = agent.state().last_operations[0]
    assert (record.kind, record.status, record.message) == ("pause", "cancelled", "cancelled before it finished")
    metrics = agent.metrics.render(paused=False, ready=True, requests=engine.request_counts()).decode()
    assert 'rl_agent_operations_total{kind="pause",status="cancelled"} 1.0' in metrics
    assert agent.gate.busy_with is None  # the gate is free again


async def test_the_records_keep_the_newest(agent):
    for i in range(KEPT + 3):
        await agent.weights.set_version(f"v{i}")
    records = agent.state().last_operations
    assert len(records) == KEPT and records[0].kind == "update_weight_version"
    assert records[0].started_at >= records[-1].started_at


# -- the transfer protocol's order ------------------------------------------------------------------
@pytest.mark.parametrize(
    "joined,open_,call,allowed",
    [
        (False, False, "start_weight_update", False),  # no group yet
        (True, False, "start_weight_update", True),
        (True, True, "start_weight_update", False),  # already open
        (None, False, "start_weight_update", True),  # unknown: the engine decides
        (True, None, "start_weight_update", True),
        (True, False, "update_weights", False),  # nothing open
        (True, True, "update_weights", True),
        (True, None, "update_weights", True),
        (True, False, "finish_weight_update", False),
        (True, True, "finish_weight_update", True),
        (False, None, "finish_weight_update", True),
    ],
)
def test_transfer_order(joined, open_, call, allowed):
    state = TransferState(joined=joined, open=open_)
    if allowed:
        state.check(call)
    else:
        with pytest.raises(ConflictError):
            state.check(call)


async def test_a_transfer_out_of_order_is_refused_before_the_engine(agent):
    engine = sim(agent)
    with pytest.raises(ConflictError, match="init_weight_transfer_engine first"):
        await agent.transfer.start()
    await agent.transfer.init({"master_address": "127.0.0.1"})
    with pytest.raises(ConflictError, match="start_weight_update before update_weights"):
        await agent.transfer.update({"names": ["w"]})
    await agent.transfer.start()
    with pytest.raises(ConflictError, match="already open"):
        await agent.transfer.start()
    await agent.transfer.update({"names": ["w"]})
    await agent.transfer.finish("t1")
    assert (agent.transfer.state.joined, agent.transfer.state.open) == (True, False)
    assert agent.weight_version == "t1" and engine.weight_update_chunks == 1
    # The refused calls never reached the gate: only the four that ran are recorded.
    assert [op.kind for op in agent.state().last_operations][::-1] == [
        "init_weight_transfer",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
    ]
    await agent.transfer.shutdown()
    with pytest.raises(ConflictError, match="init_weight_transfer_engine first"):
        await agent.transfer.start()


async def test_a_failed_chunk_ends_the_update_and_unknown_weights_are_not_ready(agent):
    engine = sim(agent)
    await agent.transfer.init({})
    await agent.transfer.start()
    engine.fail_next("update_weights", "broadcast broke")
    with pytest.raises(EngineCallError):
        await agent.transfer.update({"names": ["w"]})
    assert agent.transfer.state.open is False  # as vLLM's worker: the update is over
    assert agent.weight_version is None and "broadcast broke" in (agent.readiness.not_ready_reason() or "")
    with pytest.raises(ConflictError, match="before finish_weight_update"):
        await agent.transfer.finish("t1")
    await agent.transfer.start()
    await agent.transfer.update({"names": ["w"]})
    await agent.transfer.finish(None)  # new weights, unnamed: no version, but whole again
    assert agent.weight_version is None and agent.readiness.not_ready_reason() is None


async def test_after_a_failed_call_the_engine_judges_the_order(agent):
    engine = sim(agent)
    engine.fail_next("init_weight_transfer", "no rendezvous")
    with pytest.raises(EngineCallError):
        await agent.transfer.init({})
    assert agent.transfer.state.joined is None
    # Unknown to the agent, so the call goes to the engine, which has no group and says so.
    with pytest.raises(EngineCallError, match="not initialised"):
        await agent.transfer.start()
    assert agent.transfer.state.open is None
    await agent.transfer.init({})
    await agent.transfer.start()
    assert agent.transfer.state.open is True


# -- the LoRA registry ---------------------------------------------------------------------------------
async def test_an_adapter_keeps_its_id_across_swaps_and_a_failed_load_takes_none(agent, tmp_path):
    engine = sim(agent)
    one, two = write_adapter(tmp_path / "one"), write_adapter(tmp_path / "two")
    a = await agent.lora.load(LoraLoadRequest(name="a", path=str(one)))
    engine.fail_next("add_lora", "refused")
    with pytest.raises(EngineCallError):
        await agent.lora.load(LoraLoadRequest(name="b", path=str(two)))
    b = await agent.lora.load(LoraLoadRequest(name="b", path=str(two)))
    swapped = await agent.lora.load(LoraLoadRequest(name="a", path=str(two), version="2"))
    assert (a.adapter_id, b.adapter_id, swapped.adapter_id) == (1, 2, 1)
    assert [(i.name, i.version) for i in agent.state().loras] == [("a", "2"), ("b", None)]
    assert await agent.lora.unload("a") == {2}
    c = await agent.lora.load(LoraLoadRequest(name="c", path=str(one)))
    assert c.adapter_id == 3 and engine.served_lora_names() == ["b", "c"]

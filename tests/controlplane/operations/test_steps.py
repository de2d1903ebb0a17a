"""The step executor (operations/steps.py) over real agents in memory, and the pure decisions
operations make around it (verify's checksum verdicts), without I/O."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rlcp.controlplane.controller import Controller
from rlcp.controlplane.operations.steps import Executor, StepIncomplete
from rlcp.controlplane.operations.verify import judge, judge_adapter
from rlcp.controlplane.workers.capabilities import CONTROL, DRIVER, STAGED_UPDATE, StagedUpdate
from rlcp.controlplane.workers.fanout import Retry
from rlcp.controlplane.workers.steps import Step, status_answer
from rlcp.core.wire.agent.checksums import EMPTY_TENSOR_SHA256
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.faults import Fault
from rlcp.harness.memory import MemoryFleet
from rlcp.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


def _failures(ctl: Controller) -> dict[tuple[str, str], float]:
    return {
        (s.labels["worker"], s.labels["phase"]): s.value
        for metric in ctl.metrics.registry.collect()
        if metric.name == "rlcp_worker_failures"
        for s in metric.samples
        if s.name.endswith("_total")
    }


async def test_one_step_records_each_result_the_pause_state_and_the_failures(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    tracker = ctl.log.begin("pause", epoch=ctl.registry.membership.epoch, detail={})
    steps = Executor(fanout=ctl.fanout, registry=ctl.registry, metrics=ctl.metrics, tracker=tracker, log=ctl.log)
    memory_fleet["w1"].faults["/pause"] = Fault("status", 500)
    done = await steps.run(
        Step(name="pause", can=CONTROL, call=lambda w: w.pause("keep", 1.0), deadline_s=5), ctl.members()
    )
    assert [r.id for r in done.ok] == ["w0", "w2"] and done.refused == {"w1": 500}
    assert {w: (r.status, r.phase) for w, r in tracker.results.items()} == {
        "w0": ("ok", "pause"),
        "w1": ("error", "pause"),
        "w2": ("ok", "pause"),
    }
    assert ctl.log.phase == "pausing"  # the phase the state shows, from the step's name
    # The pause state the step left, on the workers that took it, before any status read.
    records = {r.id: r for r in ctl.members()}
    assert records["w0"].status is not None and records["w0"].status.paused is True
    assert records["w1"].status is not None and records["w1"].status.paused is False
    assert records["w1"].last_result is not None and records["w1"].last_result.status == "error"
    assert _failures(ctl) == {("w1", "pause"): 1.0}
    assert memory_fleet["w0"].service.paused and not memory_fleet["w1"].service.paused


async def test_a_status_answer_is_observed_and_an_abort_step_raises_after_recording(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    tracker = ctl.log.begin("pause", epoch=ctl.registry.membership.epoch, detail={})
    steps = Executor(fanout=ctl.fanout, registry=ctl.registry, metrics=ctl.metrics, tracker=tracker, log=ctl.log)
    assert all(r.reported_at is None for r in ctl.members())  # no answer has reported a status yet
    read = Step(name="status", can=DRIVER, call=lambda w: w.status(), deadline_s=5, observe=status_answer)
    await steps.run(read, ctl.members())
    assert all(r.status is not None and r.reported_at is not None for r in ctl.members())
    memory_fleet["w2"].faults["/resume"] = Fault("status", 500)
    resume = Step(name="resume", can=CONTROL, call=lambda w: w.resume(), deadline_s=5, on_failure="abort")
    with pytest.raises(StepIncomplete) as raised:
        await steps.run(resume, ctl.members())
    assert [r.id for r in raised.value.done.ok] == ["w0", "w1"] and raised.value.step is resume
    assert tracker.results["w2"].status == "error" and tracker.results["w0"].phase == "resume"


async def test_an_amending_step_keeps_a_workers_first_failure(memory_fleet: MemoryFleet, tmp_path: Path) -> None:
    ctl = memory_fleet.controller(tmp_path)
    tracker = ctl.log.begin("pause", epoch=ctl.registry.membership.epoch, detail={})
    steps = Executor(fanout=ctl.fanout, registry=ctl.registry, metrics=ctl.metrics, tracker=tracker, log=ctl.log)
    steps.fail("w0", phase="verify", code="verify_failed", message="checksums differ")
    memory_fleet["w0"].faults["/pause"] = Fault("status", 500)
    again = Step(name="pause", can=CONTROL, call=lambda w: w.pause("keep", 1.0), deadline_s=5, on_failure="amend")
    await steps.run(again, [r for r in ctl.members() if r.id in ("w0", "w1")])
    first = tracker.results["w0"]
    assert first.code == "verify_failed" and first.phase == "verify"
    assert (first.message or "").startswith("checksums differ; then pause failed:")
    assert tracker.results["w1"].status == "ok" and tracker.results["w1"].phase == "pause"


def test_checksums_are_judged_against_the_majority_then_the_earlier_waves() -> None:
    good, bad = {"a": "1", "b": "2"}, {"a": "1", "b": "9"}
    verdict = judge({"w0": good, "w1": good, "w2": bad}, "v1", without=[])
    assert set(verdict.failed) == {"w2"} and verdict.agreed == good
    assert "differ from 2 other worker(s) at version 'v1': 1 tensor(s) differ (b)" in verdict.failed["w2"]
    # A later wave of one is held to what the first agreed on, not to itself.
    later = judge({"w3": bad}, "v1", without=[], reference=good)
    assert set(later.failed) == {"w3"} and "earlier waves" in later.failed["w3"]


def test_a_manifest_is_checked_tensor_by_tensor_and_a_worker_without_checksums_fails_it() -> None:
    manifest = {"a": "1"}
    verdict = judge({"w0": {"a": "1", "x": "5"}, "w1": {"a": "7", "x": "5"}}, "v2", without=["w2"], manifest=manifest)
    assert set(verdict.failed) == {"w1", "w2"}
    assert "manifest" in verdict.failed["w1"] and "gave no weight checksums" in verdict.failed["w2"]


def test_tensors_hashed_as_no_bytes_are_compared_nowhere() -> None:
    verdict = judge({"w0": {"a": EMPTY_TENSOR_SHA256, "b": "2"}, "w1": {"a": "3", "b": "2"}}, "v1", without=[])
    assert verdict.failed == {} and verdict.not_compared == frozenset({"a"})


def test_an_adapter_is_judged_by_the_majority_and_a_worker_without_its_checksums_is_not() -> None:
    held = {"w0": {"lora:x:a": "1"}, "w1": {"lora:x:a": "1"}, "w2": {"lora:x:a": "2"}, "w3": {}}
    assert judge_adapter(held, "x") == {"w2": "adapter 'x' checksums differ from 2 other worker(s)"}
    assert judge_adapter({"w3": {}}, "x") == {}


async def test_a_retried_step_asks_again_only_while_the_failure_may_pass_and_a_pre_check_records_nothing(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    steps = Executor(fanout=ctl.fanout, registry=ctl.registry, metrics=ctl.metrics)
    late, never = tmp_path / "not-there-yet", str(tmp_path / "never-there")
    w0 = [r for r in ctl.members() if r.id == "w0"]

    def checks() -> int:
        return sum("/v1/agent/weights/check" in call for call in memory_fleet["w0"].calls)

    def check(path: str, retry: Retry | None) -> Step[StagedUpdate, None]:
        return Step(
            name="check",
            can=STAGED_UPDATE,
            call=lambda w: w.check_weights(path, "weights"),
            deadline_s=5,
            retry=retry,
        )

    may_pass = frozenset({"path_unavailable"})
    once = await steps.ask(check(str(late), None), w0)
    assert [o.result.code for o in once] == ["path_unavailable"] and checks() == 1

    # Asked again while the failure may pass: the checkpoint appears once the step has asked twice
    # more, and the step then succeeds. (Not a count of attempts within a time: a loaded machine
    # makes fewer, CI40.)
    async def appear() -> None:
        await wait_for(lambda: checks() >= 3, what="the retried step asking again")
        os.rename(write_checkpoint(tmp_path / ".staging", 1), late)

    appearing = asyncio.create_task(appear())
    try:
        again = await steps.ask(check(str(late), Retry(codes=may_pass, wait_s=0.05, within_s=60)), w0)
        await appearing
    finally:
        appearing.cancel()  # a no-op once it ended; else it would outlive a failed ask
    assert [o.ok for o in again] == [True], [o.result for o in again]
    # ... for at most `within_s`: then its last failure is its result.
    gave_up = await steps.ask(check(never, Retry(codes=may_pass, wait_s=0.05, within_s=0.3)), w0)
    assert [o.result.code for o in gave_up] == ["path_unavailable"]
    # A failure outside the retry's codes is not asked again.
    before = checks()
    other = await steps.ask(check(never, Retry(codes=frozenset({"path_forbidden"}), wait_s=0.05, within_s=30)), w0)
    assert [o.result.code for o in other] == ["path_unavailable"] and checks() == before + 1
    assert all(r.last_result is None for r in ctl.members())  # a pre-check's read records nothing


async def test_a_retried_workers_last_answer_stands_when_its_next_attempt_gets_none(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    """The check said "not there"; its next attempt hangs and the step's deadline cuts it. The
    result is what the worker said, not "no answer": a pre-check that lost it let an adapter no
    worker could load through to both workers (a 502 where a 422 was due, on a loaded run)."""
    ctl = memory_fleet.controller(tmp_path)
    steps = Executor(fanout=ctl.fanout, registry=ctl.registry, metrics=ctl.metrics)
    missing = str(tmp_path / "never-there")
    w0 = [r for r in ctl.members() if r.id == "w0"]
    # The first check is served as it is (a one-time rule for its method wins over the path's);
    # every later one hangs, so the deadline can only cut an attempt made after an answer.
    memory_fleet["w0"].faults.add("POST", "/v1/agent/weights/check", Fault("delay", delay_s=0.0, times=1))
    memory_fleet["w0"].faults["/v1/agent/weights/check"] = Fault("hang")
    step: Step[StagedUpdate, None] = Step(
        name="check",
        can=STAGED_UPDATE,
        call=lambda w: w.check_weights(missing, "weights"),
        deadline_s=1.0,
        retry=Retry(codes=frozenset({"path_unavailable"}), wait_s=0.05, within_s=30),
    )
    [outcome] = await steps.ask(step, w0)
    assert outcome.result.status == "error" and outcome.result.code == "path_unavailable", outcome.result
    assert "then: check did not finish within 1s" in (outcome.result.message or ""), outcome.result
    assert [what for _, _, what in memory_fleet["w0"].faults.seen][:2] == ["delay", "hang"]

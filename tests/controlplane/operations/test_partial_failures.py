"""A partial failure answers when the operation ends, not after reading workers that already
failed (`Run.answering`), and every failed worker carries a stable error code. Real agents on
SimEngine behind `MemoryTransport` (rlcp/harness/memory.py): a worker that dies in the middle of
an update and then answers nothing, as a killed or frozen pod does."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rlcp.controlplane.operations.pause import pause
from rlcp.controlplane.operations.weights import update_weights
from rlcp.core.wire.controller.pause import PauseRequest
from rlcp.harness.controller import disk_update
from rlcp.harness.faults import Fault
from rlcp.harness.waiting import LoopStalls

pytestmark = pytest.mark.timeout(60)


def lag_s(result, stalls: LoopStalls) -> float:
    """From the operation's end (its last worker result) to its answer in the caller's hands, less
    the time the test's loop, which runs the controller and its agents too, could not run: the
    bound is on what the code waited, not on the machine's load."""
    return (datetime.now(UTC) - result.finished_at).total_seconds() - stalls.s


async def test_a_worker_dying_mid_update_costs_the_answer_nothing_after_its_result(memory_fleet, tmp_path):
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    w2 = memory_fleet["w2"]
    w2.faults.add("POST", "/v1/agent/weights/update", Fault("reset"))  # gone during its update...
    w2.faults.add("GET", "/v1/agent/state", Fault("hang"))  # ...and answering nothing since
    async with LoopStalls() as stalls:
        result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
        lag = lag_s(result, stalls)
    assert result.status == "partial"
    # A status read of w2 would have held the answer for its deadline (control_s = 4 s here).
    assert lag < 0.1, f"answered {lag:.3f}s after the operation ended"
    by_id = {r.worker_id: r for r in result.results}
    assert (by_id["w2"].status, by_id["w2"].phase, by_id["w2"].code) == ("error", "update", "unreachable")
    assert all(by_id[w].status == "ok" and by_id[w].code is None for w in ("w0", "w1"))
    assert [a.engine.served_version for a in (memory_fleet["w0"], memory_fleet["w1"])] == ["v1", "v1"]


async def test_every_failure_has_a_stable_code_and_a_failed_operation_answers_at_once(memory_fleet, tmp_path):
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    for a in memory_fleet.agents.values():
        a.faults.add("GET", "/v1/agent/state", Fault("hang"))
    memory_fleet["w0"].faults.add("POST", "/v1/agent/weights/update", Fault("status", 409))
    memory_fleet["w1"].faults.add("POST", "/v1/agent/weights/update", Fault("hang"))
    memory_fleet["w2"].faults.add("POST", "/v1/agent/weights/update", Fault("status", 500))
    async with LoopStalls() as stalls:
        result = await update_weights(ctl, disk_update(tmp_path, "v2", 2).model_copy(update={"timeout_s": 0.5}))
        lag = lag_s(result, stalls)
    assert result.status == "failed" and lag < 0.1, (result.status, lag)
    codes = {r.worker_id: (r.phase, r.status, r.code) for r in result.results}
    assert codes == {
        "w0": ("update", "error", "injected"),
        "w1": ("update", "timeout", "timeout"),
        "w2": ("update", "error", "injected"),
    }, codes
    # A pause whose members all hang answers at its deadline, not a status deadline later.
    for a in memory_fleet.agents.values():
        a.faults.clear()
        a.faults.add("GET", "/v1/agent/state", Fault("hang"))
        a.faults.add("POST", "/pause", Fault("hang"))
    async with LoopStalls() as stalls:
        result = await pause(ctl, PauseRequest(mode="keep", timeout_s=0.3))
        lag = lag_s(result, stalls)
    assert result.status == "failed" and lag < 0.1, (result.status, lag)
    assert {r.code for r in result.results} == {"timeout"}


async def test_an_agent_too_old_for_the_checkpoint_check_is_updated_as_before(memory_fleet, tmp_path):
    """A rolling upgrade meets agents without `POST /v1/agent/weights/check` and
    `POST /v1/agent/weights/update` (404): no evidence against the checkpoint, and the update
    goes in the three calls such an agent takes, its prepare without the field it would refuse."""
    old, prepares = memory_fleet["w0"], []
    answer = old.handle

    async def handle(method: str, path: str, params: dict, body: object) -> tuple[int, object]:
        if path in ("/v1/agent/weights/check", "/v1/agent/weights/update"):
            return 404, {"error": {"code": "not_found", "message": "Not Found"}}
        if path == "/v1/agent/prepare":
            prepares.append(body)
        return await answer(method, path, params, body)

    old.handle = handle  # type: ignore[method-assign]
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    assert result.status == "ok", result.results
    assert prepares and all("weights_path" not in body for body in prepares), prepares
    assert all(a.engine.served_version == "v1" for a in memory_fleet.agents.values())

"""Each flavor's driver declares its disk update's steps (`update_steps`, workers/updates.py), and
those steps make the calls the flavor's protocol has: the agent's one call, the others' pause and
load. The operation (`Roll.wave`) runs what is declared and never asks which protocol a member speaks.

aioresponses stands in for the workers (conftest.py): a call a declared step should not make fails
as a connection error."""

from __future__ import annotations

import pytest

from rlcp.controlplane.deadlines import Deadlines
from rlcp.controlplane.workers.capabilities import DISK_WEIGHTS, STAGED_UPDATE, LoadReport, implements
from rlcp.controlplane.workers.updates import UPDATE_STEPS, WaveUpdate
from tests.controlplane.workers.flavors.test_agent_flavor import AGENT_STATE
from tests.controlplane.workers.flavors.wire import BASE, make, sent

DEADLINES = Deadlines(
    call_s=10.0,
    pause_s=60.0,
    weight_load_s=300.0,
    transfer_init_s=60.0,
    transfer_chunk_s=60.0,
    checkpoint_wait_s=10.0,
    grace_s=5.0,
)


def _update(*, checksums: bool = True, resumes: bool = True) -> WaveUpdate:
    return WaveUpdate(
        path="/w/v2",
        version="v2",
        mode="keep",
        pause_s=DEADLINES.pause(3.0),
        requested_s=3.0,
        checksums=checksums,
        expected_checksums=None,
        resumes=lambda worker_id: resumes,
        deadlines=DEADLINES,
    )


@pytest.mark.parametrize("flavor", ["agent", "vllm", "dynamo", "sglang"])
async def test_every_disk_weights_flavor_declares_its_update(session, flavor: str) -> None:
    driver = make(flavor, session)
    assert implements(driver, UPDATE_STEPS)
    steps = driver.update_steps(_update(), [driver])
    if flavor == "agent":  # one call, which pauses as it loads: a failure may have left it paused
        assert steps.pause is None and steps.uncertain
        assert steps.update.can is STAGED_UPDATE
        assert steps.update.deadline_s == DEADLINES.update_in_one_call(3.0, checksums=True)
    else:  # pause, then load; the resume after verification
        assert steps.pause is not None and steps.pause.name == "pause" and not steps.uncertain
        assert steps.update.can is DISK_WEIGHTS
    assert steps.update.name == "update"


async def test_separate_calls_give_the_load_hashing_time_only_where_a_load_hashes(session) -> None:
    vllm, dynamo = make("vllm", session), make("dynamo", session)
    hashing = DEADLINES.load_step(3.0, checksums=True)
    plain = DEADLINES.load_step(3.0, checksums=False)
    assert hashing > plain
    assert dynamo.update_steps(_update(), [dynamo]).update.deadline_s == plain
    assert vllm.update_steps(_update(), [vllm]).update.deadline_s == hashing
    # Members declaring alike run as one step: a mixed wave's load is given the hashing time.
    assert dynamo.update_steps(_update(), [vllm, dynamo]).update.deadline_s == hashing
    assert vllm.update_steps(_update(checksums=False), [vllm]).update.deadline_s == plain


async def test_the_agents_declared_update_is_the_one_call_with_the_waves_plan(session, wire) -> None:
    answer = {
        "status": "updated",
        "weight_version": "v2",
        "checksums": {"model.w": "ab"},
        "resumed": False,
        "held_back": None,
        "state": AGENT_STATE | {"paused": True, "weight_version": "v2"},
    }
    wire.post(f"{BASE}/v1/agent/weights/update", payload=answer)
    driver = make("agent", session)
    steps = driver.update_steps(_update(resumes=False), [driver])
    report = await steps.update.call(driver)
    assert report.load == LoadReport("v2", {"model.w": "ab"}) and not report.resumed
    assert steps.update.observe is not None and steps.update.observe(report) == report.status
    [(method, url, body)] = sent(wire)
    assert (method, url) == ("POST", f"{BASE}/v1/agent/weights/update")
    assert body["path"] == "/w/v2" and body["version"] == "v2" and body["resume"] is False

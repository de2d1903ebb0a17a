"""The broadcast push while a Ray-placed fleet changes under it (issue 47, through `PUT /v1/rl/placement`).

A real Ray head on loopback; the controller (its own process, a Ray driver) places SimEngine agents
as detached actors and discovers them from the dashboard (tests/controlplane/placement/
test_ray_placement.py's settings). The plan's changes are what `python -m rlcp.localfleet --ray
--churn` applies (`rlcp.harness.placed_churn.PlacedMembers` under `rlcp.harness.churn.Churn`): a
join and a leave scale the placement by one; a crash SIGKILLs an actor's process once a push's
round is open (`BroadcastSync.round_started`), and Ray restarts it. The trainer is `BroadcastSync`
with `rlcp.harness.sim_trainer` standing in for vLLM's trainer engine (SimEngine joins no
collective). The run holds after each step until its changes landed, so each push meets the fleet
the plan says. What must hold: no push fails; each change costs one re-form or two (a restart can
land while the crashed push forms its group again); the members at the end hold the last version.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlcp.client.client import ControlPlaneClient
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.churn import Churn, parse_churn
from rlcp.harness.controller import CTL_TOKEN
from rlcp.harness.placed_churn import PlacedMembers
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.raycluster import RayHead
from rlcp.harness.sim_trainer import sim_join
from rlcp.harness.waiting import wait_for
from rlcp.rl.sync import BroadcastSync, Pushed
from tests.support.ray import NAMESPACE, PREFIX, placement_config, ray_head

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray"), pytest.mark.timeout(300)]
MODEL = {"model.embed_tokens.weight": [8, 4], "lm_head.weight": [4, 8]}
PLAN = "1:join,3:crash=rlcp-agent-0,4:leave"
STEPS = 5


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    with ray_head(num_cpus=2, num_gpus=3) as started:  # logical GPUs: one per bundle, up to 3 agents
        yield started


async def test_pushes_land_while_placement_scales_and_ray_restarts_a_crashed_agent(
    head: RayHead, tmp_path: Path
) -> None:
    root = tmp_path / "weights"
    write_checkpoint(root / "v0", 0)
    settings = placement_config(tmp_path / "ctl", head, root, replicas=2, teardown=True)
    ctl = ControllerProcess(settings, tmp_path / "ctl", start_timeout_s=90)
    said: list[str] = []
    pushed: list[Pushed] = []
    try:
        await ctl.spawn().wait_ready_async()
        async with ControlPlaneClient(ctl.url, token=CTL_TOKEN, timeout_s=30) as client:

            async def placed_and_answering(n: int) -> bool:
                return sum(w.reachable for w in (await client.state()).workers) == n

            await wait_for(lambda: placed_and_answering(2), 120, "two agents placed and answering", interval_s=0.2)
            members = PlacedMembers(client, head, NAMESPACE, PREFIX, deadline_s=120)
            churn = Churn(
                parse_churn(PLAN), members, [f"{PREFIX}0", f"{PREFIX}1"], started=2, say=said.append, prefix=PREFIX
            )
            sync = BroadcastSync(
                ctl.url,
                CTL_TOKEN,
                None,
                timeout_s=30,
                join=sim_join(),
                round_started=lambda version: churn.on_push(int(version.removeprefix("b"))),
            )
            try:
                for k in range(1, STEPS + 1):
                    pushed.append(await sync.push(MODEL, f"b{k}"))
                    churn.on_step(k)
                    await churn.finish()  # the run holds until the step's changes landed
            finally:
                await sync.close()
                await churn.close()
            st = await client.state()
    finally:
        ctl.stop()

    trace = [(p.version, p.error, [c.describe() for c in p.reformed_for]) for p in pushed] + said
    assert sorted(c.what for c in churn.history) == [
        f"crash {PREFIX}0",
        f"join {PREFIX}2",
        f"leave {PREFIX}2",
        f"restart {PREFIX}0",
    ], trace
    assert [p.error for p in pushed] == [None] * STEPS, trace
    reforms = [len(p.reformed_for) for p in pushed]
    # b1 on the first two; b2 re-forms for the joiner; b3's round meets the crashed agent (one
    # re-form without it, or a second if Ray's restart lands meanwhile) and b4 takes it back if b3
    # did not; b5 re-forms for the leave.
    assert (reforms[0], reforms[1], reforms[4]) == (0, 1, 1), trace
    assert 1 <= reforms[2] <= 2 and reforms[2] + reforms[3] in (2, 3), trace
    assert pushed[1].reformed_for[0].joined == [f"{PREFIX}2"], trace
    assert pushed[4].reformed_for[0].left == [f"{PREFIX}2"], trace
    assert {w.id: (w.weight_version, w.reachable) for w in st.workers} == {
        f"{PREFIX}0": ("b5", True),
        f"{PREFIX}1": ("b5", True),
    }, trace
    assert st.applied.weight_version == "b5" and st.pause_state == "running", trace

"""The RL run while the fleet changes under it, on real vLLM CPU agents (issue 47).

The same broadcast-synced `train_through_fleet` as tests/rl/test_rl_run.py, but the controller
discovers its members from a listing (`rlcp.harness.churn.ListingServer`, `discovery.kind:
http_listing`) that changes at step boundaries (`rlcp.harness.churn.Churn`, what the local fleet's
`--churn` applies): a third agent joins (2 -> 3 engines), is SIGKILLed in the middle of a
broadcast and started again (3 -> 2 -> 3), and one of the first two leaves (-> 2). Training never
waits for a change. What must hold: no push fails (each change costs a push one re-form at most;
the crash fails its round, and the same push forms the group again once discovery unlists the
dead member), every step's tokens come
from the version pushed before it (the fence keeps a joiner and a restarted member out until the
reconciler converged them from the version's disk copy), the engines' logprobs match the
trainer's on every member that answered, the joiner included, and the reward climbs as in the
static run.

Cost: the session's two agents, and ONE more agent process (set up with them, so the three
engines start together). Its restart after the kill is an engine start-up (~30-100 s, longer than
the run's steps together): the run goes on while it starts, and holds once, after step
`HOLD_AFTER`, until it has landed (`between_steps`), so the last steps show the restarted
member; likewise after the join's step until the joiner is inside the fence, so that it serves
before it is killed. `RLCP_ELASTIC_OUT=<dir>` keeps the run's step lines, JSONL and plot there
(docs/trainer-guide.md shows them).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.client.client import ControlPlaneClient
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.churn import Churn, ListedMembers, ListingServer, parse_churn
from rlcp.harness.controller import CTL_TOKEN, controller_settings
from rlcp.harness.processes import AgentProcess
from rlcp.harness.waiting import wait_for
from rlcp.rl.loop import MISMATCH_TOLERANCE, RunSettings, StepRecord
from rlcp.rl.report import step_line
from rlcp.rl.run import Fleet, train_through_fleet
from tests.conftest import one_core, vllm_agent_config

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
STEPS, LR, MARGIN = 20, 1e-2, 0.25  # the static run's lr and margin (tests/rl/test_rl_run.py)
TOKENS = 4 * 8 * 16
# The crash strikes in step 5's push, once its round is open and before any tensor moves (`Churn.on_push`).
PLAN = "3:join,5:crash=vllm-2,8:leave=vllm-1"
JOIN_STEP = 3  # the plan's join: the run holds after it until the joiner serves (an engine start-up outlasts steps)
# An agent's restart is an engine start-up: ~30 s on a quiet machine, 97 s seen on a loaded one, while
# a step takes ~1 s. The run goes on while it starts; after this step it waits for the restart to
# land, so that the steps after show the restarted member converged and serving.
HOLD_AFTER = 10


def gain(records: list[StepRecord]) -> float:
    return sum(r.reward for r in records[-3:]) / 3 - sum(r.reward for r in records[:3]) / 3


@pytest.fixture(scope="session")
def _joiner_process(tiny_models, tmp_path_factory):
    """The third agent, spawned and not waited for. Session-scoped only so that pytest sets it up
    before the session's two agents (it orders fixtures by scope): the three engines then start
    together. `joiner` stops it after the test."""
    config = vllm_agent_config(tiny_models) | {"agent_id": "vllm-2", "require_desired_version": True}
    agent = AgentProcess(config, tmp_path_factory.mktemp("vllm-joiner"), env=one_core(1), name="vllm-2").spawn()
    yield agent
    agent.stop()


@pytest.fixture
def joiner(_joiner_process):
    """The third agent, listed only when the plan's join comes; stopped whatever happens."""
    yield _joiner_process
    _joiner_process.stop()


async def test_a_policy_learns_while_agents_join_leave_and_die(joiner, vllm_agent, vllm_agent_b, tiny_models, tmp_path):
    t_test = time.monotonic()
    listing = ListingServer()
    url = await listing.start()
    first = {"vllm-0": vllm_agent, "vllm-1": vllm_agent_b}
    for name, agent in first.items():
        listing.list(WorkerSpec(**agent.spec(name)))
    settings = controller_settings(
        tmp_path,
        [],
        discovery={
            "kind": "http_listing",
            "http_listing": {"url": url, "interval_s": 0.25, "timeout_s": 2, "default_flavor": "agent"},
        },
        allowed_roots=[str(tiny_models["base"].parent), str(tmp_path)],
        workers={"token": vllm_agent.token, "timeout_s": 30, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        weight_transfer={"init_timeout_s": 150, "chunk_timeout_s": 150},
        gateway={"port": 0, "hold_timeout_s": 60},
    )
    lines: list[str] = []
    async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
        ctl = client.server.app[CONTROLLER]
        await wait_for(
            lambda: {r.id for r in ctl.members() if r.status and r.status.world_size} == set(first),
            timeout_s=30,
            what="both agents listed and polled",
        )
        ctl_url = str(client.make_url("")).rstrip("/")
        async with ControlPlaneClient(ctl_url, token=CTL_TOKEN) as admin:
            await admin.update_weights("rl-start", str(tiny_models["base"]))

            async def start_joiner(name: str, index: int) -> AgentProcess:
                assert name == "vllm-2"
                return await joiner.wait_ready_async()

            async def dropped(member: str) -> None:
                await wait_for(lambda: member not in {r.id for r in ctl.members()}, timeout_s=30, what="dropped")

            members = ListedMembers(listing, {}, start_joiner, dropped)
            churn = Churn.listed(parse_churn(PLAN), members, say=lines.append, prefix="vllm-")

            gateway = client.server.app[GATEWAY]

            async def hold(r: StepRecord) -> None:
                if r.step == JOIN_STEP:
                    # The joiner must serve before it is killed: in a full run its engine was still
                    # starting when the kill came (it never served). Until it is inside the fence.
                    t = time.monotonic()
                    await wait_for(
                        lambda: "vllm-2" in ((table := gateway.router.table()) and table.routes or {}),
                        timeout_s=600,  # its engine start-up has a deadline of its own, and this waits on it
                        what="the joiner converged and inside the fence",
                    )
                    lines.append(f"  (the run held {time.monotonic() - t:.1f}s after step {r.step} for the join)")
                if r.step == HOLD_AFTER:
                    t = time.monotonic()
                    await churn.finish()  # bounded by the agent's own start-up deadline
                    lines.append(f"  (the run held {time.monotonic() - t:.1f}s after step {r.step} for the restart)")

            try:
                out = await train_through_fleet(
                    Fleet(ctl_url, client.server.app[GATEWAY].url, CTL_TOKEN),
                    tiny_models["base"],
                    tiny_models["base"].parent / "rl-elastic",
                    RunSettings(steps=STEPS, lr=LR),
                    sync="broadcast",
                    label="elastic",
                    say=lines.append,
                    on_step=lambda r: churn.on_step(r.step),
                    membership=churn.landed,
                    between_steps=hold,
                    round_started=churn.on_push,
                )
                landed = [(c.step, c.what) for c in churn.history]
                await churn.finish()  # its errors, if any
            finally:
                await churn.close()
                # The session's agents as other tests expect them: both listed, on weights-1 as `base`.
                listing.list(WorkerSpec(**vllm_agent_b.spec("vllm-1")))
                listing.unlist("vllm-2")
                await wait_for(
                    lambda: {r.id for r in ctl.members() if r.status} == set(first), timeout_s=30, what="the first two"
                )
                await admin.update_weights("base", str(tiny_models["weights-1"]))
                await listing.close()
    took = time.monotonic() - t_test
    if keep := os.environ.get("RLCP_ELASTIC_OUT"):
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(out.log, keep)
        if out.plot:
            shutil.copy(out.plot, keep)
        Path(keep, "elastic.txt").write_text("\n".join([*lines, f"test took {took:.0f}s"]) + "\n")

    rs = out.records
    said = "\n".join(step_line(r, STEPS) for r in rs) + "\n" + "\n".join(lines)
    # Every change landed during the run: the join, the crash and the restart, the leave.
    assert sorted(w for _, w in landed) == ["crash vllm-2", "join vllm-2", "leave vllm-1", "restart vllm-2"], said
    # The crash landed inside step 5's push (its record names it), and that push re-formed and landed.
    crashed = next(r for r in rs if any(c.startswith("crash vllm-2") for c in r.membership))
    assert (crashed.step, crashed.reforms, crashed.sync_error) == (5, 1, None), said
    assert sum(len(r.membership) for r in rs) == 4, said  # each in the record of the step it landed in
    assert [r.sync_error for r in rs] == [None] * STEPS, said
    # Re-forms: at most one per change, and only in the step a change landed in or the next one.
    changed = {r.step for r in rs if r.membership}
    assert all(r.reforms <= 2 for r in rs), said
    assert 1 <= sum(r.reforms for r in rs) <= 4, said
    assert all(r.step in changed or r.step - 1 in changed for r in rs if r.reforms), said
    # The fence: each step's every token from the weights pushed just before it, whoever served it.
    assert [r.versions for r in rs] == [{"rl-start": TOKENS}] + [{f"step-{k}": TOKENS} for k in range(1, STEPS)], said
    # The logprob check on every member that answered, the joiner (before and after its restart) included.
    for r in rs:
        assert set(r.mismatch_by_worker) == set(r.workers), (r.step, said)
        assert all(d <= MISMATCH_TOLERANCE for d in r.mismatch_by_worker.values()), (r.step, said)
    served = [r.step for r in rs if "vllm-2" in r.workers]
    restart_step = next(r.step for r in rs if any(c.startswith("restart vllm-2") for c in r.membership))
    assert any(s < restart_step for s in served) and any(s > restart_step for s in served), (served, said)
    assert gain(rs) > MARGIN, [round(r.reward, 3) for r in rs]

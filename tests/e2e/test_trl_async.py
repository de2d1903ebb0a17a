"""TRL 1.16.0's own `AsyncGRPOTrainer`, unchanged, trains through two real vLLM CPU agents behind the one URL.

`python -m rlcp.rl.trl` (what `bash scripts/run-local.sh --trainer trl` runs) in a process of its own,
as a user runs it, pointed at the gateway's port of a controller over the suite's shared agents (LoRA
on, `max_loras` 3), with `api.allow_anonymous` (TRL sends no token). TRL probes the fleet, chooses
adapter-only sync, and publishes `trl-policy-v<N>` after every step; the fleet loads each on both
engines. Checked: every rollout TRL's rollout process got was answered, by an adapter TRL had
published (the answer's `model`), on both workers; the reward's climb is an xfail when it does not
come (below: not yet reliable). The negative control is the same
run with TRL's no-op weight transfer: every rollout comes from the base model, and the reward stays
flat.

The margin: TRL's first steps score ~0.002-0.008 (the target is 1 token in ~500). Two 16-step runs, seed 0,
lr 5e-2, staleness 1: a local-fleet run at load average ~20 left 0.01 at step 7 and ended at 0.42, 0.62
(first three 0.005, last three 0.389); this test's run on a quiet machine (144 s for 16 steps) took off
later: 0.025 at steps 10-13, then 0.062, 0.096, 0.119 (last three 0.092). Which adapter sampled which
step's rollouts depends on timing (TRL's rollout process generates ahead), so the take-off step moves.
A third run (this test, 20 steps, quiet machine) never took off: 0.000-0.006 every step. TRL scores a
whole completion, so a group of 8 with no `!` in any of its 128 tokens (~3 groups in 4 at first) has no
signal at all, where the project's own run rewards every token; the take-off is luck-dependent. So the
climb (a gain of 0.05 over 20 steps: the last three steps' mean ~20x the base rate, where the control
never scored above 0.006 in any step) is reported as an xfail when it does not happen, not asserted;
what every run showed is asserted: every rollout answered, by an adapter TRL published, on both workers.

A denser reward was tried and did not make the climb reliable: the share of tokens that are one ASCII
punctuation character (32 of the tiny tokenizer's 430 tokens, `!` among them; the base model samples
them ~8% of the time, so every group has variance from step 1). This test's run, 12 steps, seed 0, lr
5e-2: 0.084 0.076 0.115 0.102 0.076 0.043 0.051 0.057 0.082 0.082 0.125 0.119 (first three 0.092,
last three 0.109), where its control (8 steps, TRL's no-op transfer) held 0.070-0.084. A stand-in for
TRL's loss on the tiny model in plain torch (sequence reward, group-normalised advantage, LoRA r=8,
AdamW 5e-2, PPO clip 0.2, gradient norm 1; not TRL itself; seed 0, one run each) points at a cause: on-policy,
that reward went 0.076 -> 0.707 by step 7 and 0.99 by step 9; trained, as TRL's adapter sync must
be (`max_staleness` >= 1), on samples one policy version old, it stayed at 0.05-0.10 for 12 steps at
lr 3e-3, 1e-2, 2e-2, 5e-2 and 2e-1, and reached 0.22 at step 12 with the clip opened (0.2 -> 10). The
single `!` target, one version stale, went 0.000 -> 0.47 in 12 steps in that stand-in. So the reward
stays the RL run's, and what limits the climb here is the one version of staleness TRL's adapter sync
requires, not only the reward's sparsity; not asserted until a setting makes it reliable.

The negative control runs 6 steps (244 s at load ~20, its engines already up): all 775 rollouts asked for
and were answered by `tiny`, the base, on both workers, and the reward stayed within 0.000-0.006. Its
strong evidence is where the rollouts came from; over 6 steps the synced run's reward has not taken off
yet either (0.010 at step 6), so the flat reward alone would prove little, and 16 more steps would cost
CI another ~5 minutes.

Cost, measured on a quiet machine with the shared engines already up: the synced run 217 s, the control
119 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.client.client import ControlPlaneClient
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import CTL_TOKEN, controller_settings
from rlcp.harness.processes import child_env
from rlcp.harness.waiting import wait_for
from rlcp.rl.trl.run import TrlSettings

pytest.importorskip("trl", reason="the trl extra (TRL 1.16.0, peft)")
# Two TRL runs take ~5.5 min beside engines already up: more than the suite's whole budget can give
# its critical path today (issue 44), and the reward's climb is not yet reliable enough to be
# asserted. Run it on purpose: RLCP_TEST_TRL=1 bash scripts/test.sh tests/e2e/test_trl_async.py
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.environ.get("RLCP_TEST_TRL") != "1", reason="two TRL runs take minutes: set RLCP_TEST_TRL=1"),
]
STEPS = 20
NO_SYNC_STEPS = 6
REPO = Path(__file__).resolve().parents[2]
MARGIN = 0.05  # the last three steps' mean reward over the first three's: see the module docstring
PER_STEP = TrlSettings().prompts_per_step * TrlSettings().group  # samples TRL trains on in a step


@pytest.fixture
async def fleet_url(vllm_agent, vllm_agent_b, tiny_models, tmp_path):
    """The gateway's URL of a controller over both shared agents, on the base weights, with no
    adapter loaded (TRL's sync at staleness 1 needs all of `max_loras` 3) and no token required."""
    agents = [vllm_agent, vllm_agent_b]
    settings = controller_settings(
        tmp_path,
        [a.spec(f"vllm-{i}") for i, a in enumerate(agents)],
        api={"token": CTL_TOKEN, "allow_anonymous": True},
        allowed_roots=[str(tiny_models["base"].parent), str(tmp_path)],
        workers={"token": vllm_agent.token, "timeout_s": 30, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        gateway={"port": 0, "hold_timeout_s": 60},
    )
    async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
        ctl = client.server.app[CONTROLLER]
        await wait_for(
            lambda: all(r.status and r.status.world_size for r in ctl.members()),
            timeout_s=30,
            what="both agents polled",
        )
        url = str(client.make_url("")).rstrip("/")
        async with ControlPlaneClient(url, token=CTL_TOKEN) as admin:
            await admin.update_weights("base", str(tiny_models["weights-1"]))
            state = await admin.state()
            for name in {lora for w in state.workers for lora in (w.loras or {})}:
                await admin.unload_lora(name)  # what earlier tests left on the shared engines
            yield client.server.app[GATEWAY].url
            for name in {lora for w in (await admin.state()).workers for lora in (w.loras or {})}:
                await admin.unload_lora(name)


def out_dir(tiny_models: dict[str, Path], tmp_path: Path) -> Path:
    """Where TRL writes its adapters: the engines read them, so under the agents' allowed root."""
    return tiny_models["base"].parent / f"trl-{tmp_path.name}"


async def run_trl(url: str, model_dir: Path, out: Path, *extra: str) -> dict:
    """`python -m rlcp.rl.trl` in its own process (TRL's client blocks, and spawns its rollout
    process); its summary, and its output on failure."""
    summary = out / "summary.json"
    # This checkout's `rlcp` first (a shared venv's editable install may point at another one).
    env = child_env(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rlcp.rl.trl",
        "--url",
        url,
        "--model-dir",
        str(model_dir),
        "--out",
        str(out),
        "--summary",
        str(summary),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=600)
    finally:
        if proc.returncode is None:  # SIGTERM first: the run then stops TRL's rollout process
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    text = output.decode(errors="replace")
    print(text[-6000:])
    assert summary.exists(), f"the TRL run ended ({proc.returncode}) without a summary:\n{text[-4000:]}"
    return json.loads(summary.read_text())


async def test_trl_async_grpo_trains_through_the_fleet_on_the_adapters_it_published(fleet_url, tiny_models, tmp_path):
    t0 = time.monotonic()
    s = await run_trl(fleet_url, tiny_models["base"], out_dir(tiny_models, tmp_path), "--steps", str(STEPS))
    print(f"TRL run: {time.monotonic() - t0:.0f}s; {json.dumps({k: v for k, v in s.items() if k != 'steps'})}")
    assert len(s["steps"]) == STEPS
    assert s["rollouts"] >= STEPS * PER_STEP, "TRL's rollouts were not all recorded"
    assert s["rollouts_failed"] == 0
    assert s["rollouts_not_published"] == 0, "a rollout came from an adapter TRL did not publish"
    assert s["published"] == [f"trl-policy-v{k}" for k in range(1, STEPS + 2)]
    assert set(s["workers"]) == {"vllm-0", "vllm-1"}, "the rollouts did not spread over both agents"
    gain = s["reward_last3"] - s["reward_first3"]
    if gain <= MARGIN:
        # Not yet reliable (module docstring): said in the run's report as an xfail, never hidden.
        pytest.xfail(f"the reward did not climb in {STEPS} steps this run: gain {gain:.3f} <= {MARGIN}")


async def test_without_sync_trl_samples_the_base_and_does_not_learn(fleet_url, tiny_models, tmp_path):
    s = await run_trl(
        fleet_url, tiny_models["base"], out_dir(tiny_models, tmp_path), "--steps", str(NO_SYNC_STEPS), "--no-sync"
    )
    assert s["rollouts"] >= NO_SYNC_STEPS * PER_STEP
    assert s["rollouts_failed"] == 0
    assert s["rollouts_not_published"] == 0  # every one from `tiny`, the base: nothing else was published
    assert s["published"] == ["tiny"]
    assert max(step["reward"] for step in s["steps"]) < 0.05, s["steps"]

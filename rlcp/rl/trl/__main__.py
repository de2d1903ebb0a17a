"""`python -m rlcp.rl.trl`: TRL's AsyncGRPOTrainer, unchanged, against a fleet that is up.

    python -m rlcp.rl.trl --url http://127.0.0.1:8090 --model-dir .local-fleet/models/base --out runs/trl
    python -m rlcp.rl.trl ... --no-sync          # the negative control: TRL's no-op weight transfer

`--url` is the fleet's one URL (the gateway's port, or the controller's); TRL sends no token, so the
controller must run with `api.allow_anonymous: true` (docs/operator-guide.md). `--model-dir` is the
checkpoint the engines serve, with LoRA on (`max_loras >= max_staleness + 2`, 3 by default).
`bash scripts/run-local.sh --trainer trl` starts such a fleet and runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from rlcp.rl.cli import at_least, parse_run_args
from rlcp.rl.trl.run import TrlRun, TrlSettings, train_with_trl, write_run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = TrlSettings()
    p = argparse.ArgumentParser(prog="python -m rlcp.rl.trl", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the fleet's one URL (TRL's vllm_server_base_url)")
    p.add_argument("--model-dir", type=Path, required=True, help="the checkpoint the engines serve")
    p.add_argument("--out", type=Path, default=Path("trl-run"), help="adapters, the rollout log, the step log, plot")
    p.add_argument("--steps", type=at_least(1), default=d.steps)
    p.add_argument("--lr", type=at_least(0.0, float, strictly=True), default=d.lr)
    p.add_argument("--seed", type=int, default=d.seed)
    # GRPO's advantage is a completion's reward against its group's: a group of 1 has none.
    p.add_argument("--group", type=at_least(2), default=d.group, help="completions per prompt (TRL's num_generations)")
    p.add_argument(
        "--epsilon-high",
        type=at_least(0.0, float),
        default=d.epsilon_high,
        help="TRL's: the PPO ratio's upper clip - 1",
    )
    p.add_argument(
        "--max-staleness", type=at_least(0), default=d.max_staleness, help="TRL's; engines need max_loras >= it + 2"
    )
    p.add_argument("--no-sync", action="store_true", help="TRL's no-op weight transfer (the negative control)")
    p.add_argument("--summary", type=Path, help="also write the run's summary here as JSON")
    return parse_run_args(p, argv)


def report(run: TrlRun, label: str) -> dict[str, object]:
    s = run.summary()
    log, plot = write_run(run, label)
    print(
        f"\nsummary: reward {s['reward_first3']:.3f} (first 3 steps) -> {s['reward_last3']:.3f} (last 3) in "
        f"{s['wall_s']:.0f}s; {s['rollouts']} rollouts, {s['rollouts_failed']} failed, "
        f"{s['rollouts_not_published']} from an adapter TRL did not publish; by worker {s['workers']}",
        flush=True,
    )
    print(f"log: {log}" + (f"\nplot: {plot}" if plot else ""), flush=True)
    return s


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # said once here: async_grpo is TRL's experimental API
    # SIGTERM as an exception, so TRL's own `finally` stops its rollout process: killed outright, the
    # trainer leaves that child behind, generating against the fleet (seen: orphans after a stop).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    settings = TrlSettings(
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        group=args.group,
        epsilon_high=args.epsilon_high,
        max_staleness=args.max_staleness,
        sync=not args.no_sync,
    )
    out = args.out.resolve()
    summary_path = args.summary.resolve() if args.summary else None
    run = train_with_trl(
        args.url.rstrip("/"), args.model_dir.resolve(), out, settings, say=lambda s: print(s, flush=True)
    )
    s = report(run, "trl-async-lora" if settings.sync else "trl-async-nosync")
    if summary_path:
        summary_path.write_text(json.dumps({**s, "steps": [vars(x) for x in run.steps]}, indent=1))
    ok = run.steps and s["rollouts_failed"] == 0 and s["rollouts_not_published"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

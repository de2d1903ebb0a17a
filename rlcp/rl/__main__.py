"""`python -m rlcp.rl`: the RL run against a fleet that is already up.

    python -m rlcp.rl --controller http://ctl:8080 --gateway http://ctl:8090 --token $RLCP_TOKEN \\
        --model-dir /models/tiny --out runs/first              # gloo broadcast on CPU
    python -m rlcp.rl ... --device cuda --backend nccl         # the same trainer on a GPU

`--model-dir` is the checkpoint the engines serve (the trainer starts from the same weights).
`bash scripts/run-local.sh` starts a local fleet and runs this same trainer over it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from rlcp.client.client import ControlPlaneClientError
from rlcp.rl.cli import at_least, parse_run_args
from rlcp.rl.loop import MISMATCH_TOLERANCE, RunSettings
from rlcp.rl.run import Fleet, train_through_fleet
from rlcp.rl.sampling import SamplingError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rlcp.rl", description=__doc__.splitlines()[0])
    p.add_argument("--controller", required=True, help="the controller's API URL")
    p.add_argument("--gateway", required=True, help="the fleet's inference gateway URL")
    p.add_argument("--token", default=os.environ.get("RLCTL_TOKEN"), help="API token (default: $RLCTL_TOKEN)")
    p.add_argument("--model", default="tiny", help="the served model name")
    p.add_argument("--model-dir", type=Path, required=True, help="the checkpoint the engines serve")
    p.add_argument("--out", type=Path, default=Path("rl-run"), help="steps' weights, the JSONL log and the plot")
    p.add_argument("--steps", type=at_least(1), default=20)
    p.add_argument("--lr", type=at_least(0.0, float, strictly=True), default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sync", choices=("broadcast", "disk"), default="broadcast")
    p.add_argument("--mode", choices=("sync", "async"), default="sync")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="broadcast: gloo on CPU, nccl on GPU")
    p.add_argument("--device", default="cpu", help="the trainer's torch device (cuda with --backend nccl)")
    p.add_argument("--no-push", action="store_true", help="never push (the negative control)")
    return parse_run_args(p, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = RunSettings(steps=args.steps, lr=args.lr, seed=args.seed, mode=args.mode, push=not args.no_push)
    fleet = Fleet(args.controller.rstrip("/"), args.gateway.rstrip("/"), args.token, args.model)
    try:
        out = asyncio.run(
            train_through_fleet(
                fleet,
                args.model_dir.resolve(),
                args.out.resolve(),
                settings,
                sync=args.sync,
                backend=args.backend,
                device=args.device,
                label=f"rlcp-{args.mode}-{args.sync}",
            )
        )
    except (ControlPlaneClientError, SamplingError, OSError) as exc:  # OSError: a model directory that is not one
        print(f"rlcp.rl: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"log: {out.log}" + (f"\nplot: {out.plot}" if out.plot else ""))
    worst = max((r.mismatch_max for r in out.records if r.mismatch_max is not None), default=None)
    ok = all(r.sync_error is None for r in out.records) and (
        not settings.push or (worst is not None and worst <= MISMATCH_TOLERANCE)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

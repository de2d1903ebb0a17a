"""What the trainers' command lines share (`python -m rlcp.rl`, `python -m rlcp.rl.trl`): the
checks on a run's arguments, made before anything is started."""

from __future__ import annotations

import argparse


def parse_run_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`p`'s arguments, refused (exit 2, naming the argument) unless `--steps` is at least 1 and
    `--model-dir` holds a checkpoint (its `config.json`): the one the engines serve."""
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if not (args.model_dir / "config.json").is_file():
        p.error(f"--model-dir {args.model_dir} holds no config.json: give the checkpoint the engines serve")
    return args

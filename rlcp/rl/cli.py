"""What the trainers' command lines share (`python -m rlcp.rl`, `python -m rlcp.rl.trl`): the
checks on a run's arguments, made before anything is started."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def at_least(minimum: N, kind: type[N] = int, *, strictly: bool = False) -> Callable[[str], N]:
    """An argparse `type`: a finite `kind` at least `minimum` (more than it, `strictly`). argparse names
    the flag in its refusal (exit 2): `argument --group: must be an int >= 2, got '1'`."""
    wanted = f"must be a{'n' if kind is int else ''} {kind.__name__} {'>' if strictly else '>='} {minimum:g}"

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            value = None
        # NaN compares false with everything, so it is refused by name, with the infinities.
        if value is None or not math.isfinite(value) or value < minimum or (strictly and value == minimum):
            raise argparse.ArgumentTypeError(f"{wanted}, got {text!r}")
        return value

    return parse


def parse_run_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`p`'s arguments, refused (exit 2, naming the argument) unless `--model-dir` holds a
    checkpoint (its `config.json`): the one the engines serve. Bounds on numbers are the
    arguments' own types (`at_least`)."""
    args = p.parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        p.error(f"--model-dir {args.model_dir} holds no config.json: give the checkpoint the engines serve")
    return args

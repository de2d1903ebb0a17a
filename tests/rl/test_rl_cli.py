"""The trainers' command lines (`python -m rlcp.rl`, `python -m rlcp.rl.trl`) refuse a number out of
range before anything starts: exit 2, naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcp.rl.__main__ import parse_args as rl_args
from rlcp.rl.trl.__main__ import parse_args as trl_args
from tests.support.cli import argparse_refusal


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--group", "1", "argument --group: must be an int >= 2, got '1'"),
        ("--group", "0", "argument --group: must be an int >= 2, got '0'"),
        ("--group", "two", "argument --group: must be an int >= 2, got 'two'"),
        ("--epsilon-high", "-0.5", "argument --epsilon-high: must be a float >= 0, got '-0.5'"),
        ("--epsilon-high", "nan", "argument --epsilon-high: must be a float >= 0, got 'nan'"),
        ("--lr", "0", "argument --lr: must be a float > 0, got '0'"),
        ("--steps", "0", "argument --steps: must be an int >= 1, got '0'"),
        ("--max-staleness", "-1", "argument --max-staleness: must be an int >= 0, got '-1'"),
    ],
)
def test_trl_refuses_a_number_out_of_range_naming_the_flag(
    model_dir: Path, flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--url", "http://127.0.0.1:1", "--model-dir", str(model_dir), f"{flag}={value}"]
    assert argparse_refusal(trl_args, argv, capsys).endswith(said)


def test_trl_takes_the_bounds_themselves(model_dir: Path) -> None:
    argv = ["--url", "u", "--model-dir", str(model_dir), "--group", "2", "--epsilon-high", "0", "--max-staleness", "0"]
    args = trl_args(argv)
    assert (args.group, args.epsilon_high, args.max_staleness, args.steps) == (2, 0.0, 0, 20)


@pytest.mark.parametrize(("flag", "value"), [("--steps", "0"), ("--lr", "-1e-2"), ("--lr", "inf")])
def test_rl_refuses_a_number_out_of_range_naming_the_flag(
    model_dir: Path, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--controller", "c", "--gateway", "g", "--model-dir", str(model_dir), f"{flag}={value}"]
    assert f"argument {flag}: must be" in argparse_refusal(rl_args, argv, capsys)


def test_a_model_dir_without_a_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    said = argparse_refusal(trl_args, ["--url", "u", "--model-dir", str(tmp_path)], capsys)
    assert "--model-dir" in said and "config.json" in said

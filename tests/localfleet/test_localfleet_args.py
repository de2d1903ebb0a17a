"""The local fleet's flags for a fleet left to the user's own trainer: `--serve-only` (or
`--steps 0`), `--lora` with its capacity, and the banner naming the one URL."""

from __future__ import annotations

import argparse

import pytest

from rlcp.localfleet.options import LoraFlags, parse_args
from rlcp.localfleet.report import banner
from rlcp.localfleet.start import engine_section
from tests.support.cli import argparse_refusal


def test_steps_0_or_serve_only_leave_the_fleet_up_with_no_trainer() -> None:
    for argv in (["--steps", "0"], ["--serve-only"], ["--sim", "--steps", "0", "--keep-running"]):
        args = parse_args(argv)
        assert (args.serve_only, args.keep_running, args.steps) == (True, True, 0), argv
    args = parse_args(["--sim", "--steps", "2"])
    assert (args.serve_only, args.keep_running) == (False, False)
    with pytest.raises(SystemExit):  # steps and no trainer contradict each other
        parse_args(["--serve-only", "--steps", "3"])


def test_lora_is_off_unless_asked_and_its_capacity_needs_it() -> None:
    assert parse_args([]).lora is None
    assert parse_args(["--lora"]).lora == LoraFlags(max_loras=4, max_lora_rank=16)
    assert parse_args(["--lora", "--max-loras", "3", "--max-lora-rank", "8"]).lora == LoraFlags(3, 8)
    assert LoraFlags().max_loras >= 3  # TRL: max_staleness + 2, with a staleness of 1 at least
    for bad in (["--max-loras", "5"], ["--lora", "--max-loras", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_engines_get_lora_on_or_off_said_either_way(tmp_path) -> None:
    sim = engine_section(parse_args(["--sim"]), None)
    assert sim["kind"] == "sim" and sim["enable_lora"] is False  # the agent's own default is on
    on = engine_section(parse_args(["--sim", "--lora", "--max-loras", "3"]), None)
    assert (on["enable_lora"], on["max_loras"], on["max_lora_rank"]) == (True, 3, 16)
    vllm = engine_section(parse_args(["--lora"]), tmp_path / "base")
    assert (vllm["kind"], vllm["enable_lora"], vllm["max_loras"]) == ("vllm", True, 4)
    assert vllm["extra_engine_args"]["weight_transfer_config"] == {"backend": "gloo"}
    assert engine_section(parse_args([]), tmp_path / "base")["enable_lora"] is False


def _banner(args: argparse.Namespace) -> str:
    return banner(args, url="http://127.0.0.1:8080", gateway="http://127.0.0.1:8090", token="t", model="m", what="w")


def test_the_banner_names_the_one_url_then_the_controller() -> None:
    text = _banner(parse_args(["--serve-only", "--lora"]))
    lines = [line for line in text.splitlines() if line]
    assert lines[0] == (
        "The fleet's URL (point a trainer here, e.g. TRL's vllm_server_base_url): http://127.0.0.1:8090"
    )
    assert "Controller: http://127.0.0.1:8080   API token: t" in text
    assert "LoRA: on (max_loras=4" in text and "--serve-only" in text
    assert "LoRA: off" in _banner(parse_args(["--steps", "2"]))


def test_trainer_trl_turns_lora_on_and_refuses_sim_engines() -> None:
    pytest.importorskip("trl", reason="the trl extra")
    args = parse_args(["--trainer", "trl"])
    assert (args.lora, args.steps, args.lr) == (LoraFlags(), 20, None)  # lr: rlcp.rl.trl's own default
    assert parse_args(["--trainer", "trl", "--max-loras", "3"]).lora == LoraFlags(3, 16)
    with pytest.raises(SystemExit):
        parse_args(["--trainer", "trl", "--sim"])


@pytest.mark.parametrize(
    ("flag", "value", "wanted"),
    [
        ("--agents", "0", "an int >= 1"),
        ("--steps", "-1", "an int >= 0"),
        ("--rollouts-per-step", "-2", "an int >= 0"),
        ("--staleness", "-1", "an int >= 0"),
        ("--max-loras", "0", "an int >= 1"),
        ("--max-lora-rank", "0", "an int >= 1"),
        ("--sim-load-s", "nan", "a float >= 0"),
        ("--sim-token-s", "-0.5", "a float >= 0"),
    ],
)
def test_a_number_out_of_bounds_is_refused_naming_its_flag(flag, value, wanted, capsys) -> None:
    said = argparse_refusal(parse_args, ["--sim", flag, value], capsys)
    assert said.endswith(f"argument {flag}: must be {wanted}, got {value!r}")

"""The TRL run's record (`rlcp.rl.trl.run.write_run`): its step log and the reward plot the RL run's
report draws. The plot reads each step's membership changes (the elastic run's); a TRL step has
none, and before it said so every TRL run ended in an AttributeError after its last step."""

from __future__ import annotations

import json

import pytest

from rlcp.rl.trl.run import TrlRun, TrlStep, write_run

pytest.importorskip("matplotlib")


def test_a_trl_run_writes_its_step_log_and_its_plot(tmp_path):
    steps = [
        TrlStep(k, 0.01 * k, 10.0 * k, f"trl-policy-v{k + 1}", {f"trl-policy-v{k}": 32}, {"vllm-0": 32}, 0.5, 0.0)
        for k in (1, 2, 3)
    ]
    log, plot = write_run(TrlRun(steps, [], [], (), tmp_path), "trl-async-lora")
    assert [json.loads(line)["reward"] for line in log.read_text().splitlines()] == [0.01, 0.02, 0.03]
    assert plot is not None and plot.stat().st_size > 0

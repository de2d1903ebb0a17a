"""The one-command local fleet (`python -m rlcp.localfleet --sim`), run as a user runs it.

SimEngine agents keep these fast (seconds); the vLLM mode is the same code with another
engine block in the agents' config, and is run by hand (see the module docstring).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcp.harness.processes import REPO, run_to_end

pytestmark = pytest.mark.timeout(150)


def _localfleet(workdir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlcp.localfleet",
        "--sim",
        "--agents",
        "2",
        "--port",
        "0",
        "--gateway-port",
        "0",
        "--workdir",
        str(workdir),
        *extra,
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_steps_on_a_sim_fleet(tmp_path: Path) -> None:
    run = run_to_end(_localfleet(tmp_path, "--steps", "2"), cwd=REPO, timeout_s=120)
    out = run.stdout
    assert run.returncode == 0, out
    for k in (1, 2):
        assert re.search(rf"^step {k}/2 +ok .*applied=step-{k} +converged=yes +verified=yes", out, re.M), out
    last_step = out[out.index("step 2/2") :]
    assert re.findall(r"^ +(agent-\d) +version=step-2 +ready=yes +paused=no", last_step, re.M) == [
        "agent-0",
        "agent-1",
    ], out
    assert "summary: 2/2 steps ok" in out
    # Rollouts went through the gateway, and each is tallied by the version its answer named.
    assert re.search(r"^The fleet's URL \(point a trainer here.*\): +http://127\.0\.0\.1:\d+$", out, re.M), out
    tally = re.search(r"by the version that served them \(X-RL-Weight-Version\): (.*)$", out, re.M)
    assert tally and re.search(r"\bstep-1=\d+", tally.group(1)), out
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert sorted(pids) == ["agent-0", "agent-1", "controller"]
    assert not [name for name, pid in pids.items() if _alive(pid)]


def test_two_steps_through_envoy(tmp_path: Path) -> None:
    """`--envoy`: the controller serves the fence over xDS, and the rollouts go through a real
    Envoy's listener (the tally's versions come from Envoy's EDS metadata); Envoy stops with the rest."""
    pytest.importorskip("grpc", reason="the envoy extra")
    run = run_to_end(_localfleet(tmp_path, "--envoy", "--steps", "2"), cwd=REPO, timeout_s=120)
    out = run.stdout
    assert run.returncode == 0, out
    for k in (1, 2):
        assert re.search(rf"^step {k}/2 +ok .*applied=step-{k} +converged=yes +verified=yes", out, re.M), out
    assert "summary: 2/2 steps ok" in out
    envoy_url = re.search(r"^Envoy up: (http://127\.0\.0\.1:\d+)", out, re.M)
    assert envoy_url, out
    assert re.search(rf"^The fleet's URL \(.*\): +{re.escape(envoy_url[1])}\n +\(Envoy: ", out, re.M), out
    tally = re.search(r"by the version that served them \(X-RL-Weight-Version\): (.*)$", out, re.M)
    assert tally and re.search(r"\bstep-1=\d+", tally.group(1)), out
    routed = re.search(r"^Envoy routed (\d+) requests", out, re.M)
    assert routed and int(routed[1]) >= 16, out  # two steps of 8 rollouts, at least, through Envoy
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert sorted(pids) == ["agent-0", "agent-1", "controller", "envoy"]
    assert not [name for name, pid in pids.items() if _alive(pid)]


def test_rolling_steps_keep_a_member_serving(tmp_path: Path) -> None:
    run = run_to_end(
        _localfleet(tmp_path, "--steps", "2", "--max-unavailable", "1", "--staleness", "1", "--sim-load-s", "0.3"),
        cwd=REPO,
        timeout_s=120,
    )
    out = run.stdout
    assert run.returncode == 0, out
    # Step 1 leaves the start-up version, which no bound admits: nobody serves for a moment.
    # From step 2 on, the previous step's version serves while the other member loads.
    assert re.search(r"^ +bubble: 2 wave\(s\); at least 0/2 members serving", out, re.M), out
    assert re.search(r"^ +bubble: 2 wave\(s\); at least 1/2 members serving", out, re.M), out
    assert "summary: 2/2 steps ok" in out


@pytest.mark.parametrize("data_plane", [[], ["--envoy"]], ids=["gateway", "envoy"])
def test_ctrl_c_stops_every_process_it_started(tmp_path: Path, data_plane: list[str]) -> None:
    if data_plane:
        pytest.importorskip("grpc", reason="the envoy extra")
    proc = subprocess.Popen(
        _localfleet(tmp_path, "--steps", "50", "--keep-running", *data_plane),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("step 1/"):
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert lines and lines[-1].startswith("step 1/"), "".join(lines)
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert len(pids) == 3 + len(data_plane) and all(_alive(pid) for pid in pids.values())
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130, "".join(lines) + rest
        assert not [name for name, pid in pids.items() if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_rl_run_is_the_default_with_engines_and_sim_keeps_the_noise_trainer() -> None:
    from rlcp.localfleet.options import parse_args

    assert (parse_args([]).trainer, parse_args([]).steps, parse_args([]).sync) == ("grpo", 20, "broadcast")
    assert (parse_args(["--sim"]).trainer, parse_args(["--sim"]).steps) == ("noise", 5)
    assert parse_args(["--mode", "async", "--sync", "disk", "--steps", "3"]).mode == "async"
    with pytest.raises(SystemExit):  # a simulated engine has no model to learn with
        parse_args(["--sim", "--trainer", "grpo"])


def test_an_agent_that_dies_is_restarted_and_converged(tmp_path: Path) -> None:
    """As a kubelet would: the local fleet starts an agent that exited again, on its ports, and
    the controller converges it to the fleet's version; nobody steps in."""
    import urllib.request

    proc = subprocess.Popen(
        _localfleet(tmp_path, "--steps", "2", "--keep-running"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []

    def read_until(pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if found := re.search(pattern, line):
                return found
            assert time.monotonic() < deadline, "".join(lines)
        raise AssertionError(f"no {pattern!r} before the run ended:\n{''.join(lines)}")

    try:
        url = read_until(r"^Controller: +(http://127\.0\.0\.1:\d+)")[1]
        read_until(r"the fleet keeps running")
        killed = json.loads((tmp_path / "pids.json").read_text())["agent-1"]
        os.kill(killed, signal.SIGKILL)
        read_until(r"agent-1 exited with -9: restarted \(1/5\)")
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert pids["agent-1"] != killed and _alive(pids["agent-1"])

        def agent_1() -> dict:
            with urllib.request.urlopen(url + "/v1/rl/state", timeout=5) as resp:
                state = json.load(resp)
            return next(w for w in state["workers"] if w["id"] == "agent-1") | {"desired": state["desired"]}

        deadline = time.monotonic() + 30
        while not ((w := agent_1())["ready"] and w["weight_version"] == w["desired"]["weight_version"] == "step-2"):
            assert time.monotonic() < deadline, (w, "".join(lines))
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert not _alive(pids["agent-1"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_steps_0_leaves_a_lora_fleet_up_for_your_own_trainer(tmp_path: Path) -> None:
    """`--steps 0` (the same as `--serve-only`) runs no trainer of ours: the fleet comes up, the
    banner names the URL to point a trainer at, and it stays up until Ctrl-C (it once exited 1
    on a ZeroDivisionError in the run's summary and took the fleet down)."""
    import urllib.request

    proc = subprocess.Popen(
        _localfleet(tmp_path, "--steps", "0", "--lora", "--max-loras", "3"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "the fleet keeps running" in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        out = "".join(lines)
        assert "the fleet keeps running" in out and proc.poll() is None, out
        one_url = re.search(r"vllm_server_base_url\): (http://\S+)", out)
        controller = re.search(r"Controller: (http://\S+)", out)
        assert one_url and controller, out
        assert "summary" not in out and "LoRA: on (max_loras=3" in out, out
        with urllib.request.urlopen(controller[1] + "/v1/rl/state", timeout=10) as resp:
            state = json.loads(resp.read())
        assert [(w["lora_enabled"], w["max_loras"]) for w in state["workers"]] == [(True, 3)] * 2, state
        with urllib.request.urlopen(one_url[1] + "/v1/models", timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130, out + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_fleet_changes_during_the_run_and_every_step_lands(tmp_path: Path) -> None:
    """`--churn`: the controller discovers the agents from the local fleet's listing; a join (an
    agent started and listed once it serves), a kill (SIGKILL, started again) and a leave (unlisted,
    stopped once the controller dropped it) land at step boundaries while every step's update lands,
    and every process the run started is gone after it."""
    run = run_to_end(
        _localfleet(tmp_path, "--steps", "6", "--churn", "1:join,2:kill=agent-0,4:leave"), cwd=REPO, timeout_s=120
    )
    out = run.stdout
    assert run.returncode == 0, out
    assert "summary: 6/6 steps ok" in out, out
    changes = re.search(r"^membership changes: (.*)$", out, re.M)
    assert changes, out
    landed = sorted(re.findall(r"(\w+ agent-\d) after step (\d)", changes[1]))
    assert landed == [
        ("join agent-2", "1"),
        ("kill agent-0", "2"),
        ("leave agent-2", "4"),
        ("restart agent-0", "2"),
    ], out
    assert re.search(r"^ +agent-1 +version=step-6 +ready=yes", out, re.M), out
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert sorted(pids) == ["agent-0", "agent-1", "agent-2", "controller"]
    assert not [name for name, pid in pids.items() if _alive(pid)]

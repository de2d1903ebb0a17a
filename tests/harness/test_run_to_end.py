"""`run_to_end`: a command run as a user runs it, stopped as Ctrl-C stops it when it overruns."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rlcp.harness.processes import ProcessError, run_to_end

# Prints, then waits; on SIGINT (Ctrl-C) says so and exits, as localfleet stops its children.
SCRIPT = """
import signal, sys, time
def stop(*_):
    print("stopped by SIGINT", flush=True)
    sys.exit(3)
signal.signal(signal.SIGINT, stop)
print("started", flush=True)
time.sleep(60)
"""


def test_a_command_that_ends_gives_its_output_and_code(tmp_path: Path) -> None:
    run = run_to_end([sys.executable, "-c", "print('hi'); raise SystemExit(2)"], cwd=tmp_path, timeout_s=30)
    assert (run.returncode, run.stdout) == (2, "hi\n")


def test_an_overrun_is_stopped_like_ctrl_c_and_the_error_carries_its_output(tmp_path: Path) -> None:
    with pytest.raises(ProcessError) as caught:
        run_to_end([sys.executable, "-c", SCRIPT], cwd=tmp_path, timeout_s=1.0, grace_s=10)
    assert "ran past 1s and was stopped" in str(caught.value)
    assert "started" in str(caught.value) and "stopped by SIGINT" in str(caught.value)


def test_a_command_deaf_to_ctrl_c_is_killed_after_the_grace(tmp_path: Path) -> None:
    deaf = "import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(os.getpid(), flush=True)"
    with pytest.raises(ProcessError) as caught:
        run_to_end([sys.executable, "-c", deaf + "; time.sleep(60)"], cwd=tmp_path, timeout_s=0.5, grace_s=0.5)
    pid = int(str(caught.value).split("its output:\n")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

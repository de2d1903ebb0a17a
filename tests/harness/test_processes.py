"""A child the harness started never has a stranger's process group signalled in its name.

`ChildProcess` stops a child by signalling its process group, the child's pid. Once the child is
reaped and its group gone, the kernel may hand the same pid to another process (pid_max is
32,768 here, and a full run wraps it several times): a stop, or an `alive()` check, must then
see that its group is gone, not signal whatever group now has that number. The reuse is made
here by pointing a reaped child's record at a stranger that leads a group of its own.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from rlcp.harness.processes import ChildProcess


def test_a_reaped_childs_pid_taken_by_another_group_leader_is_not_signalled(tmp_path: Path) -> None:
    child = ChildProcess({}, tmp_path, name="child")
    child.proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.proc.wait()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        child.proc.pid = stranger.pid  # the kernel gave the reaped child's pid to the stranger

        assert child.signal_group(signal.SIGKILL) is False
        assert child.alive() is False
        child.stop(timeout_s=1)
        assert stranger.poll() is None, "the stranger's group was signalled in the child's name"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_group_that_outlives_its_leader_is_still_signalled(tmp_path: Path) -> None:
    """The engine of an agent may outlive the agent: the leader is reaped, its pid names no
    process, and the group (still the leader's pid) is stopped as before."""
    child = ChildProcess({}, tmp_path, name="child")
    script = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    child.proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    child.proc.wait()

    assert child.alive() is True
    child.stop(timeout_s=10)
    assert child.alive() is False

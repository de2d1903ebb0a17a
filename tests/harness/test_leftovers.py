"""What the run's closing check (tests/conftest.py) rests on: a marked process's children, and
theirs, are found by the mark whatever session they moved to, and reaped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rlcp.harness.leftovers import OWNER_VAR, left_behind, reap


def test_a_grandchild_in_a_session_of_its_own_is_found_and_killed(tmp_path):
    owner = f"leftover-test-{os.getpid()}"
    pid_file = tmp_path / "grandchild.pid"
    # The child starts a grandchild in a new session (as a daemonizing server does) and exits.
    code = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))"
    )
    subprocess.run([sys.executable, "-c", code], env=os.environ | {OWNER_VAR: owner}, check=True)
    grandchild = int(pid_file.read_text())
    assert [p.pid for p in left_behind(owner)] == [grandchild]
    assert [p.pid for p in left_behind("some-other-run")] == []
    killed = reap(owner, grace_s=0.0)
    assert [p.pid for p in killed] == [grandchild] and "time.sleep(120)" in killed[0].command
    # Killed: gone once the kernel has delivered the signal (a zombie no longer counts).
    deadline = time.monotonic() + 30
    while left_behind(owner) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left_behind(owner) == []


def test_a_process_that_exits_within_the_grace_is_not_counted(tmp_path):
    owner = f"leftover-test-grace-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"], env=os.environ | {OWNER_VAR: owner})
    try:
        assert reap(owner, grace_s=60.0) == []  # on its way out: waited for, not killed
    finally:
        proc.wait()


def test_this_processs_own_resource_tracker_is_not_counted():
    # The tracker multiprocessing starts on first use (torch and vLLM use it) carries the run's
    # mark, and lives until this process exits: it is no leftover of any test.
    from multiprocessing import resource_tracker

    owner = os.environ[OWNER_VAR]  # the run's own mark (tests/conftest.py)
    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    assert tracker is not None
    # Just started, it may still be inside its exec, whose environment reads empty until done.
    environ, deadline = b"", time.monotonic() + 30
    while not environ and time.monotonic() < deadline:
        with open(f"/proc/{tracker}/environ", "rb") as f:
            environ = f.read()
        time.sleep(0.01)
    assert f"{OWNER_VAR}={owner}".encode() in environ.split(b"\0")
    assert tracker not in [p.pid for p in left_behind(owner)]

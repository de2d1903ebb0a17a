"""`rlcp.harness.procfs` on real processes: a child's parent, its state as it stops and as it
exits unreaped, a stopped process's every thread, a name holding spaces and parentheses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from rlcp.harness.procfs import gone, parent, state, thread_states
from rlcp.harness.waiting import wait_for_sync

# Three threads, and a command name (what /proc's `stat` shows between parentheses) that holds a
# space and a ')', as the parse must survive.
THREADS = """
import ctypes, threading, time
ctypes.CDLL(None).prctl(15, b"a) b", 0, 0, 0)  # PR_SET_NAME
for _ in range(2):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("up", flush=True)
time.sleep(60)
"""


def test_a_child_is_read_as_it_runs_stops_and_exits() -> None:
    child = subprocess.Popen([sys.executable, "-c", THREADS], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        assert Path(f"/proc/{child.pid}/comm").read_text() == "a) b\n"
        assert parent(child.pid) == os.getpid()
        assert state(child.pid) in {"R", "S"} and not gone(child.pid)
        assert len(thread_states(child.pid)) == 3

        os.kill(child.pid, signal.SIGSTOP)
        wait_for_sync(lambda: set(thread_states(child.pid)) == {"T"}, what="every thread stopped")
        assert state(child.pid) == "T" and not gone(child.pid)

        os.kill(child.pid, signal.SIGKILL)
        wait_for_sync(lambda: state(child.pid) == "Z", what="the killed child a zombie")
        assert gone(child.pid)  # exited: nothing runs, though its pid is not yet reaped
    finally:
        child.kill()
        child.wait(10)
    assert state(child.pid) is None and parent(child.pid) is None and thread_states(child.pid) == []
    assert gone(child.pid)

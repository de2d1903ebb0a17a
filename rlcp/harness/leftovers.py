"""Processes a test run left behind: found by a mark in their environment, reaped, named.

A test process marks its environment (`mark_owner`: `RLCP_TEST_OWNER=<its pid>`) before it
starts anything; every child inherits the mark, and so does every process a child starts in
turn (an engine's workers, a daemonized Ray raylet, an Envoy), whatever process group or
session it moves to. At the end of the run, any process still carrying the mark is one a
fixture did not stop: `left_behind` lists them from `/proc` (Linux), and `reap` gives each a
moment to finish exiting (a child told to stop at teardown may still be on its way out), then
kills what is left. The suite fails when anything had to be killed (tests/conftest.py).

A child started with an environment built from scratch carries no mark and is not seen: the
harness builds children's environments from this process's (`processes.child_env`).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rlcp.harness.procfs import state

OWNER_VAR = "RLCP_TEST_OWNER"


@dataclass(frozen=True)
class Leftover:
    pid: int
    command: str


def mark_owner() -> str:
    """Mark this process's environment, so every process started from now on carries the mark."""
    os.environ[OWNER_VAR] = str(os.getpid())
    return os.environ[OWNER_VAR]


def own_helpers() -> set[int]:
    """This process's own multiprocessing helpers (its resource tracker, its fork server), started
    on first use by whatever library needed them (torch, vLLM). They live as long as this process
    and exit when it does (they read a pipe from it until EOF): not something a test left behind."""
    from multiprocessing import forkserver, resource_tracker

    pids = (
        getattr(resource_tracker._resource_tracker, "_pid", None),
        getattr(forkserver._forkserver, "_forkserver_pid", None),
    )
    return {pid for pid in pids if pid is not None}


def left_behind(owner: str, *, proc: Path = Path("/proc")) -> list[Leftover]:
    """The live processes other than this one and its own helpers whose environment carries
    `owner`'s mark."""
    mark = f"{OWNER_VAR}={owner}".encode()
    spared = {os.getpid(), *own_helpers()}
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            # A zombie is an exited child its parent has not waited for yet: nothing to kill.
            if mark not in (entry / "environ").read_bytes().split(b"\0") or state(int(entry.name), proc=proc) == "Z":
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone meanwhile, or not ours to read
        found.append(Leftover(int(entry.name), command[:300]))
    return found


def reap(owner: str, *, grace_s: float = 20.0) -> list[Leftover]:
    """The processes left behind, after `grace_s` for those on their way out; each one still
    there then is killed (SIGKILL) and returned."""
    end = time.monotonic() + grace_s
    while (found := left_behind(owner)) and time.monotonic() < end:
        time.sleep(0.2)
    for leftover in found:
        try:
            os.kill(leftover.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found

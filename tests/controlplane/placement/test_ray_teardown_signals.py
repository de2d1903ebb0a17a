"""Placement's teardown runs whatever signals stop the controller, and whichever process gets them.

A controller (front and core, `python -m rlcp.controlplane`, as production starts it) places one
SimEngine agent as a detached Ray actor in a placement group on a real Ray 2.60.0 head on loopback
(rlcp/harness/raycluster.py), with `placement.ray.teardown: true`. Once the actor is ALIVE, the
controller is stopped by one pattern of signals; once both of its processes are gone, the Ray
head's state API (read from this process, a separate client) must show no actor and no placement
group of ours. Each pattern runs `RLCP_TEARDOWN_REPEATS` times (default 1; the failure this
guards against, Ray's failure-signal handler in the driver, was seen in 1 stop of 6).

Patterns: SIGTERM (and SIGINT, as Ctrl-C sends it) to the process group, once and twice in a
row; SIGTERM to the front only; to the core only, once and twice; SIGKILL to the front (the core
sees its stdin close); and SIGTERM to the group while a scale-up's pass waits for a group Ray
cannot reserve (the teardown must not wait out that pass's deadline). A leftover is removed by a
separate driver, so one failure does not spill into the next stop. Every stop is also checked
for Ray's failure-signal handler's report in the log ("*** SIGTERM received at time=..."): the
handler that cut the stop short must not be installed at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlcp.harness.controller import AUTH, controller_config
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.procfs import gone
from rlcp.harness.raycluster import RayHead
from rlcp.harness.simfleet import TEST_TIMEOUTS
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN
from rlcp.harness.waiting import wait_for_sync
from tests.support.ray import ray_head

# One Ray head at a time in the rest part of scripts/test.sh: tests/harness/test_ray_head.py.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

NAMESPACE = "rlcp-teardown"
PREFIX = "rlcp-td-"
REPEATS = int(os.environ.get("RLCP_TEARDOWN_REPEATS", "1"))


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    with ray_head(num_cpus=2, num_gpus=0) as started:
        yield started


def config(workdir: Path, head: RayHead) -> dict[str, Any]:
    agent = {
        "engine": {"kind": "sim", "model": "sim", "sim_op_latency_s": 0.02},
        "admin": {"token": AGENT_TOKEN},
        "timeouts": TEST_TIMEOUTS,
        "log_format": "json",
    }
    return controller_config(
        workdir,
        [],
        [],
        **head.placed_fleet(
            NAMESPACE,
            PREFIX,
            agent,
            replicas=1,
            bundle={"CPU": 1.5},
            discovery={"interval_s": 0.5},
            placement={"interval_s": 0.5, "call_timeout_s": 30},
        ),
    )


def core_pid(front: int) -> int | None:
    """The front's child: the core (`python -m rlcp.controlplane --core`)."""
    for task in Path(f"/proc/{front}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if b"--core" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    return None


Send = Callable[[int, int], None]  # (front pid, core pid)
Before = Callable[[RayHead, ControllerProcess], None]  # what happens before the signals


def group(sig: int, times: int = 1) -> Send:
    def send(front: int, core: int) -> None:
        for i in range(times):
            if i:
                time.sleep(random.uniform(0.05, 1.0))  # the second while the first stop is under way
            os.killpg(front, sig)

    return send


def one(which: str, sig: int, times: int = 1) -> Send:
    def send(front: int, core: int) -> None:
        for i in range(times):
            if i:
                time.sleep(random.uniform(0.05, 1.0))
            with contextlib.suppress(ProcessLookupError):  # stopped before the second one: fine
                os.kill(front if which == "front" else core, sig)

    return send


PATTERNS: dict[str, Send] = {
    "group-TERM": group(signal.SIGTERM),
    "group-TERM-twice": group(signal.SIGTERM, 2),
    "group-INT": group(signal.SIGINT),
    "group-INT-twice": group(signal.SIGINT, 2),
    "front-TERM": one("front", signal.SIGTERM),
    "core-TERM": one("core", signal.SIGTERM),
    "core-TERM-twice": one("core", signal.SIGTERM, 2),
    "front-KILL": one("front", signal.SIGKILL),
}


def scale_beyond_the_head(head: RayHead, ctl: ControllerProcess) -> None:
    """Ask for a second agent: its bundle (1.5 CPU) does not fit beside the first on the 2-CPU
    head, so the pass waits for a group Ray cannot reserve (up to call_timeout_s, 30 s)."""
    request = urllib.request.Request(
        f"{ctl.url}/v1/rl/placement",
        method="PUT",
        data=b'{"replicas": 2}',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
    wait_for_sync(
        lambda: len(head.placement_groups(PREFIX)) == 2, timeout_s=30, what="the second group pending", interval_s=0.1
    )


BEFORE: dict[str, Before] = {"group-TERM-while-a-pass-waits": scale_beyond_the_head}
PATTERNS["group-TERM-while-a-pass-waits"] = group(signal.SIGTERM)


def leftovers(head: RayHead) -> tuple[list[str], list[str]]:
    return sorted(head.actors(NAMESPACE, PREFIX)), head.placement_groups(PREFIX)


def stop_once(head: RayHead, workdir: Path, send: Send, before: Before | None = None) -> dict[str, Any]:
    """Start a controller, wait for its actor, stop it with `send`; what was left, and how long it took."""
    ctl = ControllerProcess(config(workdir, head), workdir, start_timeout_s=90)
    ctl.spawn().wait_ready()
    try:
        wait_for_sync(
            lambda: (
                any(a["state"] == "ALIVE" for a in head.actors(NAMESPACE, PREFIX).values())
                and head.placement_groups(PREFIX)
            ),
            timeout_s=60,
            what="the placed actor ALIVE",
            interval_s=0.2,
        )
        if before is not None:
            before(head, ctl)
        front = ctl.pid
        core = core_pid(front)
        assert core is not None
        t0 = time.monotonic()
        send(front, core)
        wait_for_sync(lambda: gone(front) and gone(core), timeout_s=60, what="the controller's exit", interval_s=0.05)
        stopped_s = time.monotonic() - t0
        code = ctl.proc.wait() if ctl.proc is not None else None
    finally:
        ctl.stop()
    # Ray's kill and group removal are asynchronous: give the head a moment to show them.
    deadline = time.monotonic() + 10
    while any(left := leftovers(head)) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = ctl.log_path.read_text(errors="replace")
    return {
        "left": left,
        "stop_s": round(stopped_s, 2),
        "front_exit": code,
        "torn_down": "placement_torn_down" in log,
        "ray_signal_handler": "SIGTERM received at time=" in log,
    }


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_teardown_leaves_nothing_whatever_signals_stop_the_controller(
    head: RayHead, tmp_path: Path, pattern: str
) -> None:
    results = []
    for i in range(REPEATS):
        result = stop_once(head, tmp_path / str(i), PATTERNS[pattern], BEFORE.get(pattern))
        results.append(result)
        if any(result["left"]):
            head.remove_named(NAMESPACE, PREFIX)  # a separate driver: the next stop starts clean
    failed = [r for r in results if any(r["left"])]
    print(f"{pattern}: {len(failed)} of {len(results)} stops left actors or groups;", json.dumps(results))
    assert not failed, json.dumps(failed)
    assert all(r["torn_down"] and not r["ray_signal_handler"] for r in results), json.dumps(results)
    # The front's exit: 0 once asked to stop, 1 when the core stopped first (SIGKILLed: -9); never
    # the core's death by a signal passed on (a late second SIGTERM to an exiting core: 241).
    assert all(r["front_exit"] in (0, 1, -signal.SIGKILL) for r in results), json.dumps(results)

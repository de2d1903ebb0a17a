"""The test harness's Ray head (rlcp/harness/raycluster.py) against a real Ray 2.60.0 head.

Two failures seen in CI, made on purpose: (1) a port handed to Ray is taken by another process
before Ray binds it (in CI the runtime env agent's, bound ~25 s after the port was chosen on a
loaded machine: "[Errno 98] Address already in use", the agent, the raylet and then `ray start
--block` gone, the dashboard refusing connections under the tests; here a socket of this test
is bound to that port): `start` must see the head die of it, retry with fresh ports and come up,
the failed start's logs naming the clash; (2) the head's
dashboard process dies under a running test: a state-API read must raise RayHeadDied naming the
dead head and carrying its own logs' tails, not a bare `Connection refused`.

Every module that starts a head in the rest part of scripts/test.sh (`-n 2 --dist loadgroup`)
is in `xdist_group("ray")`, so that part runs one head at a time (each ~1.5 GB, several
seconds of both cores to start) beside the engine part's own.
"""

from __future__ import annotations

import os
import signal
import socket

import pytest

from rlcp.harness import ports, raycluster
from rlcp.harness.raycluster import RayHead, RayHeadDied
from rlcp.harness.waiting import wait_for_sync

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


def test_a_taken_port_is_retried_and_a_dead_dashboard_is_named_with_its_logs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = raycluster.PORT_NAMES.index("runtime-env-agent-port")
    squatter = socket.socket()
    real = raycluster.free_range
    calls: list[int] = []

    def first_with_the_agent_port_taken(size: int) -> int:
        first = real(size)
        if not calls:
            squatter.bind(("127.0.0.1", first + agent))  # bound, not listening: as an outgoing socket holds a port
        calls.append(first)
        return first

    monkeypatch.setattr(raycluster, "free_range", first_with_the_agent_port_taken)
    head = RayHead(num_cpus=1)
    try:
        head.start()
        taken = squatter.getsockname()[1]
        squatter.close()
        # The first start meets the squatted port and is retried on other ports. Another process may
        # take a port of a later range too (two runs' Ray heads beside each other at load ~15: a
        # second retry); each failed start is one more range, and the last one started.
        assert len(calls) == len(head.failed_starts) + 1 >= 2, head.failed_starts
        assert raycluster.ADDRESS_IN_USE in head.failed_starts[0], head.failed_starts[0]
        assert "runtime_env_agent" in head.failed_starts[0], head.failed_starts[0]
        assert head.ports["runtime-env-agent-port"] != taken
        assert all(ports.PORT_LOW <= p < ports.PORT_HIGH for p in head.ports.values()), head.ports
        assert head.actors("none", "") == {}  # up: the state API answers

        os.kill(head.dashboard_pid(), signal.SIGKILL)
        wait_for_sync(
            lambda: head.ports["dashboard-port"] not in {p for _, p in head.listeners()},
            timeout_s=30,
            what="the dashboard's port closed",
        )
        with pytest.raises(RayHeadDied) as died:
            head.actors("none", "")
        message = str(died.value)
        first = message.splitlines()[0]  # what died: the dashboard's port, or `ray start --block` itself
        assert f"dashboard port {head.ports['dashboard-port']}" in first or "exited" in first, message
        assert "--- ray-start.log" in message, message  # the head's own log, in the error
        assert head.death == message
    finally:
        squatter.close()
        head.stop()
    assert head.pids() == []

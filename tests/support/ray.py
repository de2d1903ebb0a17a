"""Real Ray heads for the tests that start one (tests/harness/test_ray_head.py tests the head itself),
and the controller settings of the placement tests: SimEngine agents placed as Ray actors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlcp.harness.controller import controller_config
from rlcp.harness.http import free_port
from rlcp.harness.raycluster import RayHead
from rlcp.harness.simfleet import TEST_TIMEOUTS
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN

NAMESPACE = "rlcp-place"
PREFIX = "rlcp-agent-"


@contextmanager
def ray_head(**resources: float) -> Iterator[RayHead]:
    """A Ray head on loopback with `resources` (`num_cpus`, `num_gpus`), stopped with every
    process it started, which the exit checks. The test process's drivers reach it on loopback
    because tests/conftest.py sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported;
    set here, it came too late wherever a test imported Ray first."""
    started = RayHead(**resources).start()
    try:
        yield started
    finally:
        started.stop()
    assert started.pids() == []


def placement_config(workdir: Path, head: RayHead, root: Path, *, replicas: int, teardown: bool) -> dict[str, Any]:
    agent = {
        "engine": {"kind": "sim", "model": "sim", "sim_op_latency_s": 0.02, "sim_load_latency_s": 1.0},
        "admin": {"token": AGENT_TOKEN},
        "allowed_roots": [str(root)],
        "timeouts": TEST_TIMEOUTS,
        "log_format": "json",
    }
    return controller_config(
        workdir,
        [],
        [root],
        gateway={"port": free_port()},
        # one desired state for the controllers that follow each other here
        store={"kind": "file", "path": str(workdir.parent / "store" / "desired.json")},
        **head.placed_fleet(
            NAMESPACE,
            PREFIX,
            agent,
            replicas=replicas,
            bundle={"CPU": 0.5, "GPU": 1},
            discovery={"interval_s": 0.2, "timeout_s": 2.0, "max_backoff_s": 1.0},
            placement={"strategy": "PACK", "interval_s": 0.5, "call_timeout_s": 60, "teardown": teardown},
        ),
    )

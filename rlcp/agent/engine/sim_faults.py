"""`SimEngine`'s prelude to every primitive: liveness, simulated latency, injected faults.

Tests make an engine fail or hang at one named primitive (`fail_next`, `hang_next`); the
names are a closed set, so a typo raises instead of injecting nothing.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from rlcp.agent.engine.base import EngineError

FAULTABLE = frozenset(
    {
        "generate",
        "pause",
        "resume",
        "is_paused",
        "abort_requests",
        "load_weights_from_disk",
        "reset_prefix_cache",
        "set_weight_version",
        "get_weight_version",
        "weight_checksums",
        "reset_weights",
        "add_lora",
        "remove_lora",
        "list_lora_ids",
        "init_weight_transfer",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "shutdown_weight_transfer",
        "sleep",
        "wake_up",
        "is_sleeping",
    }
)


class SimPrelude:
    def __init__(self, *, op_latency_s: float) -> None:
        self._op_latency_s = op_latency_s
        self.started = False
        self.dead = False
        self._faults: dict[str, tuple[Literal["fail", "hang"], str]] = {}

    def inject(self, op_name: str, kind: Literal["fail", "hang"], message: str) -> None:
        if op_name not in FAULTABLE:  # a typo would otherwise inject nothing, silently
            raise ValueError(f"unknown primitive {op_name!r}; one of {sorted(FAULTABLE)}")
        self._faults[op_name] = (kind, message)

    def check_alive(self) -> None:
        if self.dead or not self.started:
            raise EngineError("engine dead" if self.dead else "engine not started")

    async def enter(self, op: str, *, slow: bool = True) -> None:
        self.check_alive()
        fault = self._faults.pop(op, None)
        if fault is not None and fault[0] == "hang":
            await asyncio.get_running_loop().create_future()  # only cancellation ends this
        if slow and self._op_latency_s > 0:
            await asyncio.sleep(self._op_latency_s)
            self.check_alive()  # killed while we slept
        if fault is not None:
            raise EngineError(fault[1])

"""Disk weights: whether a checkpoint directory could be loaded now, and the load itself.

`check` touches no engine and takes no gate: the controller asks every worker before it
pauses any (`POST /v1/agent/weights/check`), and a prepare with `weights_path` asks again.
Its answer (a `CheckpointSummary`, the resolved directory with it) is what `load` takes: a
request that loads checks first (a directory that cannot cover the model is a 4xx with the
engine untouched) and hands the result on, so one update inspects the checkpoint once. `load`
is one operation: reload, name the version, drop the prefix cache.
"""

from __future__ import annotations

import asyncio

from rlcp.agent.checkpoint import (
    CheckpointError,
    CheckpointSummary,
    check_covers,
    inspect_checkpoint,
    read_tensor_names,
)
from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import EngineDiskWeights
from rlcp.agent.paths import allowed_dir
from rlcp.agent.weight_state import WeightState
from rlcp.core.errors import UnavailablePathError


class DiskLoads:
    def __init__(self, ctx: AgentContext, engine: EngineDiskWeights, weights: WeightState) -> None:
        self._ctx = ctx
        self._engine = engine
        self._weights = weights
        # The serving model's tensor names, when its checkpoint is at hand: a load must cover them.
        self._expected_tensors: set[str] | None = None

    def start(self) -> None:
        """Read the serving model's tensor names once, from its own checkpoint if it has one."""
        model_dir = self._engine.model_dir
        if model_dir is not None and model_dir.is_dir() and any(model_dir.glob("*.safetensors")):
            self._expected_tensors = read_tensor_names(model_dir)

    async def check(self, raw: str, field: str = "path") -> CheckpointSummary:
        """Whether a disk load of `raw` could start now: inside the roots (the directory and
        every file in it, symlinks resolved), there, readable, and holding the model's tensors.
        Touches no engine and takes no gate: the controller asks before it pauses anyone. In a
        thread: on shared storage a stat can block for seconds, and reads must keep answering."""
        return await asyncio.to_thread(self._inspect, raw, field)

    def _inspect(self, raw: str, field: str) -> CheckpointSummary:
        path = allowed_dir(raw, self._ctx.settings.allowed_roots, field=field)
        try:
            if self._expected_tensors is not None:
                return check_covers(path, self._expected_tensors)
            return inspect_checkpoint(path)
        except CheckpointError as exc:
            raise UnavailablePathError(str(exc), field=field) from exc

    async def load(self, checkpoint: CheckpointSummary, version: str, *, reset_prefix_cache: bool = True) -> None:
        """Reload every weight from `checkpoint` (what `check` answered) and name them `version`."""
        async with self._ctx.operation("update_weights_from_disk", version=version, path=str(checkpoint.path)):
            async with self._weights.changing():
                await self._ctx.call(
                    self._engine.load_weights_from_disk(checkpoint.path),
                    self._ctx.timeouts.weight_load_s,
                    "load_weights_from_disk",
                )
                await self._weights.commit(version, reset_cache=reset_prefix_cache)

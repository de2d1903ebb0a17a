"""The weights as they are: name them (`POST /update_weight_version`), checksum them, and
reset vLLM's weight checker (`POST /weight_checker`)."""

from __future__ import annotations

from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import VersionedWeights
from rlcp.agent.weight_state import WeightState


class Weights:
    def __init__(self, ctx: AgentContext, engine: VersionedWeights, state: WeightState) -> None:
        self._ctx = ctx
        self._engine = engine
        self._state = state

    async def set_version(self, version: str) -> None:
        """Name the weights the engine holds (no prefix-cache reset: the weights are the same)."""
        async with self._ctx.operation("update_weight_version", version=version):
            await self._state.name(version)
            self._state.version = version

    async def checksums(self) -> dict[str, str]:
        """One sha256 per tensor (base weights, and the adapters the engine holds). A read:
        no gate, but a deadline; refused while asleep (the tensors are offloaded or gone)."""
        self._ctx.gate.check_awake("weight_checksums")
        return await self._ctx.call(
            self._engine.weight_checksums(), self._ctx.timeouts.weight_load_s, "weight_checksums"
        )

    async def reset_checker(self) -> None:
        async with self._ctx.operation("weight_checker"):
            await self._ctx.call(self._engine.reset_weights(), self._ctx.timeouts.control_s, "reset_weights")

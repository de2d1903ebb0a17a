"""The engine's caches on request: vLLM's `POST /reset_prefix_cache` (its dev route), which a
trainer calls after it changed what the cached blocks were computed from by other means. The
agent resets the prefix cache itself on every weight update and adapter swap; this is the
explicit one, refused while asleep (nothing is cached then)."""

from __future__ import annotations

from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import EnginePrefixCache


class Caches:
    def __init__(self, ctx: AgentContext, engine: EnginePrefixCache) -> None:
        self._ctx = ctx
        self._engine = engine

    async def reset_prefix_cache(self, *, running: bool, external: bool) -> bool:
        """True once dropped; False (vLLM's answer) while requests hold blocks and `running`
        was not given: nothing was dropped."""
        async with self._ctx.operation("reset_prefix_cache"):
            return await self._ctx.call(
                self._engine.reset_prefix_cache(include_running=running, external=external),
                self._ctx.timeouts.control_s,
                "reset_prefix_cache",
            )

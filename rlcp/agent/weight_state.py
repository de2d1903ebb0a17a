"""What the agent says about the weights its engine holds: their version, and whether a
change left them unknown.

The version lives on the engine (`served_version`), whose inference port checks requests
that expect a version against it; this agent alone writes it. A weight change (a disk load,
a transfer) runs inside `changing`: one that fails part-way leaves the engine with some old
and some new weights, so no version is reported and the agent is not ready
(`rlcp/agent/readiness.py`) until a later change succeeds. `commit` names new weights.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import InferenceServing, VersionedWeights
from rlcp.core.errors import ApiError


class VersionedEngine(InferenceServing, VersionedWeights, Protocol):
    """The engine as the weight state uses it: the version it serves, and how to name weights."""


class WeightState:
    def __init__(self, ctx: AgentContext, engine: VersionedEngine) -> None:
        self._ctx = ctx
        self._engine = engine
        self.broken: str | None = None  # why the weights are unknown, after a change failed part-way
        engine.served_version = None

    @property
    def version(self) -> str | None:
        return self._engine.served_version

    @version.setter
    def version(self, version: str | None) -> None:
        self._engine.served_version = version

    async def start(self) -> None:
        """Read the engine's version once; from here on this agent tracks it."""
        self.version = await self._ctx.call(
            self._engine.get_weight_version(), self._ctx.timeouts.control_s, "get_weight_version"
        )

    @asynccontextmanager
    async def changing(self, *, completes: bool = True) -> AsyncIterator[None]:
        """A weight change that fails part-way leaves the engine's weights unknown: stop
        reporting a version and stay not ready until a later change succeeds."""
        try:
            yield
        except ApiError as exc:
            self.broken = f"last weight change failed: {exc.message}"
            self.version = None
            raise
        if completes:  # one chunk of a transfer does not make the weights whole again
            self.broken = None

    async def commit(self, version: str, *, reset_cache: bool = True) -> None:
        """After new weights: name them, and (vLLM's reload does not) drop KV computed with
        the old ones. Running and frozen requests are preempted too, so their next tokens
        are computed from the new weights rather than from stale KV. The new version is
        reported only once the cache is dropped: reporting it earlier makes the agent ready
        (and the controller route rollouts to it) while old KV blocks can still be served."""
        await self.name(version)
        if reset_cache:
            await self.drop_prefix_cache()
        self.version = version

    async def name(self, version: str) -> None:
        """Tell the engine the weights' version (the agent reports it once `version` is set)."""
        await self._ctx.call(
            self._engine.set_weight_version(version), self._ctx.timeouts.control_s, "set_weight_version"
        )

    async def drop_prefix_cache(self) -> None:
        """Drop every cached KV block, preempting running and frozen requests."""
        await self._ctx.call(
            self._engine.reset_prefix_cache(include_running=True), self._ctx.timeouts.control_s, "reset_prefix_cache"
        )

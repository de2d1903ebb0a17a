"""Generation control: pause, resume, abort, sleep and wake_up; and prepare, the first of an
update's calls.

The pause and sleep flags are kept here, from the engine's answers, so `GET /is_paused`,
`GET /is_sleeping` and the state never wait for an engine that may be busy. While the engine
is asleep, the gate refuses whatever needs its memory (`gate.WHILE_ASLEEP`); a resume is one
of those: only a wake_up brings an engine back (vLLM resumes scheduling once fully awake).
"""

from __future__ import annotations

from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import SleepMode
from rlcp.agent.operations.disk import DiskLoads
from rlcp.agent.readiness import Readiness
from rlcp.core.errors import ApiError
from rlcp.core.wire.agent.control import PauseMode


class EngineControl:
    def __init__(self, ctx: AgentContext, engine: SleepMode) -> None:
        self._ctx = ctx
        self._engine = engine
        self._paused = False
        self._sleeping = False

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def sleeping(self) -> bool:
        return self._sleeping

    async def start(self) -> None:
        """Read whether the engine is paused or asleep, once; from here on this agent tracks it."""
        self._paused = await self._ctx.call(self._engine.is_paused(), self._ctx.timeouts.control_s, "is_paused")
        self._sleeping = await self._ctx.call(self._engine.is_sleeping(), self._ctx.timeouts.control_s, "is_sleeping")

    async def sleep(self, level: int, mode: PauseMode, timeout_s: float | None = None) -> None:
        """Pause (`mode`), then release memory (level 1 or 2; level 0 pauses only). Asleep
        from here on, whatever the engine answers after it was asked: a sleep that failed or
        timed out may have taken hold, and an engine thought awake would be resumed onto
        memory that is gone. A wake_up is how it comes back."""
        async with self._ctx.operation("sleep", level=str(level), mode=mode):
            self._sleeping = self._sleeping or level >= 1
            self._paused = True
            await self._ctx.call(
                self._engine.sleep(level, mode),
                timeout_s or self._ctx.timeouts.pause_s,
                f"sleep(level={level}, mode={mode})",
            )

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Bring memory back (every allocation, or the tagged ones); True once fully awake,
        when the engine has also resumed scheduling."""
        async with self._ctx.operation("wake_up", tags=",".join(tags) if tags else None):
            # Moving the weights back is a load's work, not a control call's.
            fully_awake = await self._ctx.call(
                self._engine.wake_up(tags or None), self._ctx.timeouts.weight_load_s, "wake_up"
            )
            self._sleeping = not fully_awake
            if fully_awake:
                await self._refresh_paused()
            return fully_awake

    async def pause(self, mode: PauseMode, timeout_s: float | None = None) -> None:
        async with self._ctx.operation("pause", mode=mode):
            try:
                await self._ctx.call(
                    self._engine.pause(mode), timeout_s or self._ctx.timeouts.pause_s, f"pause(mode={mode})"
                )
            except ApiError:
                # A pause that timed out may still take effect in the engine (a wait-mode
                # pause stops scheduling before it drains): report what the engine says.
                await self._refresh_paused()
                raise
            self._paused = True

    async def _refresh_paused(self) -> None:
        try:
            self._paused = await self._ctx.call(self._engine.is_paused(), self._ctx.timeouts.control_s, "is_paused")
        except ApiError:
            self._paused = True  # unknown: say paused, so nobody routes rollouts on a guess

    async def resume(self) -> None:
        async with self._ctx.operation("resume"):
            await self._ctx.call(self._engine.resume(), self._ctx.timeouts.control_s, "resume")
            self._paused = False

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        async with self._ctx.operation("abort_requests"):
            return await self._ctx.call(
                self._engine.abort_requests(request_ids), self._ctx.timeouts.control_s, "abort_requests"
            )


async def prepare(
    control: EngineControl,
    disk: DiskLoads,
    readiness: Readiness,
    desired: str | None,
    mode: PauseMode,
    timeout_s: float | None = None,
    *,
    weights_path: str | None = None,
) -> None:
    """Told the desired version, then paused: the first of an update's three calls. With
    `weights_path`, only once the checkpoint there is known loadable (`DiskLoads.check`):
    the controller checked it a moment ago, but never pausing for weights that are not
    there is this agent's rule, not only the caller's."""
    if weights_path is not None:
        await disk.check(weights_path, "weights_path")
    readiness.set_desired_version(desired)
    await control.pause(mode, timeout_s)

"""vLLM's weight-transfer protocol, passed through with deadlines, its order checked first.

    call                          allowed when                   after it succeeds
    init_weight_transfer_engine   always (a trainer may rejoin)  joined
    start_weight_update           joined, no update open         open, no chunks yet
    update_weights (a chunk)      an update open                 open, one chunk more
    finish_weight_update          an update open                 closed
    shutdown_weight_transfer      always                         not joined

A call out of order is a 409 before the engine sees it (`TransferState.check`). The state
is this agent's view of the protocol: a call that fails leaves its part unknown (None), and
the engine judges the next call itself until one succeeds again. One exception, from vLLM's
worker: a chunk the engine failed ends the update (closed, not unknown).

A finish with a version names the new weights (`WeightState.commit`); without one, weights
that changed are no longer reported under the old version. Either way the prefix cache goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import EngineWeightTransfer, TransferInfo
from rlcp.agent.errors import EngineCallError
from rlcp.agent.weight_state import WeightState
from rlcp.core.errors import ConflictError

OrderedCall = Literal["start_weight_update", "update_weights", "finish_weight_update"]


@dataclass
class TransferState:
    """Each part True or False when known; None when a call that failed left it unknown."""

    joined: bool | None = False  # in a group: init, and no shutdown since
    open: bool | None = False  # between start_weight_update and finish_weight_update
    chunks: int = 0  # chunks since start_weight_update, failed ones included

    def check(self, call: OrderedCall) -> None:
        """409 for a call the protocol does not allow now, as far as this agent knows."""
        if call == "start_weight_update":
            if self.joined is False:
                raise ConflictError("no weight-transfer group: call init_weight_transfer_engine first")
            if self.open is True:
                raise ConflictError("a weight update is already open: call finish_weight_update first")
        elif self.open is False:
            raise ConflictError(f"no weight update is open: call start_weight_update before {call}")


class Transfer:
    def __init__(self, ctx: AgentContext, engine: EngineWeightTransfer, weights: WeightState) -> None:
        self._ctx = ctx
        self._engine = engine
        self._weights = weights
        self.state = TransferState()

    async def init(self, init_info: TransferInfo) -> None:
        async with self._ctx.operation("init_weight_transfer"):
            self.state.joined = None
            await self._ctx.call(
                self._engine.init_weight_transfer(init_info),
                self._ctx.timeouts.transfer_init_s,
                "init_weight_transfer_engine",
            )
            self.state.joined = True

    async def start(self) -> None:
        self.state.check("start_weight_update")
        async with self._ctx.operation("start_weight_update"):
            self.state.open = None
            await self._ctx.call(
                self._engine.start_weight_update(), self._ctx.timeouts.transfer_chunk_s, "start_weight_update"
            )
            self.state.open = True
            self.state.chunks = 0

    async def update(self, update_info: TransferInfo | list[TransferInfo]) -> None:
        self.state.check("update_weights")
        async with self._ctx.operation("update_weights"), self._weights.changing(completes=False):
            self.state.chunks += 1  # counted before the call: a failed chunk may have landed in part
            self.state.open = None
            try:
                await self._ctx.call(
                    self._engine.update_weights(update_info), self._ctx.timeouts.transfer_chunk_s, "update_weights"
                )
            except EngineCallError:
                self.state.open = False  # vLLM's worker ends the update with a chunk it failed
                raise
            self.state.open = True

    async def finish(self, version: str | None) -> None:
        self.state.check("finish_weight_update")
        async with self._ctx.operation("finish_weight_update", version=version), self._weights.changing():
            self.state.open = None
            await self._ctx.call(
                self._engine.finish_weight_update(), self._ctx.timeouts.transfer_chunk_s, "finish_weight_update"
            )
            self.state.open = False
            changed, self.state.chunks = self.state.chunks > 0, 0
            if version is not None:
                await self._weights.commit(version)
                return
            if changed:
                # New weights without a name (a caller that names them later, or a session
                # ended early): the old version no longer describes them.
                self._weights.version = None
            await self._weights.drop_prefix_cache()

    async def shutdown(self) -> None:
        async with self._ctx.operation("shutdown_weight_transfer"):
            self.state.joined = None
            await self._ctx.call(
                self._engine.shutdown_weight_transfer(), self._ctx.timeouts.control_s, "shutdown_weight_transfer_engine"
            )
            self.state.joined = False

"""`AgentContext`: what every operation of the agent runs on, and nothing more.

The settings (deadlines, allowed roots), the gate (one mutating operation at a time, a
deadline on every engine call) and the records. Each operation (`rlcp/agent/operations/`)
gets this and the engine as the capability it uses (`rlcp/agent/engine/base.py`), and holds
the state of its own family (the pause flag, the transfer protocol, the adapters).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from rlcp.agent.gate import EngineGate
from rlcp.agent.records import OperationRecords
from rlcp.agent.settings import AgentSettings, TimeoutSettings
from rlcp.core.wire.agent.state import OperationKind

T = TypeVar("T")


class AgentContext:
    def __init__(self, settings: AgentSettings, gate: EngineGate, records: OperationRecords) -> None:
        self.settings = settings
        self.gate = gate
        self.records = records

    @property
    def timeouts(self) -> TimeoutSettings:
        return self.settings.timeouts

    @asynccontextmanager
    async def operation(self, kind: OperationKind, **fields: str | None) -> AsyncIterator[None]:
        """Run one mutating operation: exclusive (409 if another runs), recorded, logged once."""
        async with self.gate.exclusive(kind), self.records.record(kind, **fields):
            yield

    async def call(self, awaitable: Awaitable[T], deadline_s: float, what: str) -> T:
        """One engine call under its deadline (`EngineGate.call`)."""
        return await self.gate.call(awaitable, deadline_s, what)

"""The desired state in memory: nothing survives the process."""

from __future__ import annotations

from rlcp.core.wire.controller.desired import DesiredState


class MemoryStore:
    """For tests of code above the store, and for `--no-persist` runs."""

    def __init__(self) -> None:
        self.saved: DesiredState | None = None

    async def load(self) -> DesiredState | None:
        return self.saved

    async def save(self, desired: DesiredState) -> None:
        self.saved = desired.model_copy(deep=True)

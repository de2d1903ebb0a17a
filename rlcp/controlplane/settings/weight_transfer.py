"""The `weight_transfer` section: broadcast weight updates' deadlines (`operations/broadcast.py`)."""

from __future__ import annotations

from pydantic import Field

from rlcp.core.settings import Section
from rlcp.core.wire.agent.control import PauseMode


class WeightTransferSettings(Section):
    """Broadcast weight updates (vLLM's weight-transfer protocol across the fleet)."""

    init_timeout_s: float = Field(330.0, gt=0, description="Deadline for every worker to join the trainer's group.")
    chunk_timeout_s: float = Field(600.0, gt=0, description="Deadline of start, each update chunk and finish.")
    idle_timeout_s: float = Field(600.0, gt=0, description="An open update with no call for this long is aborted.")
    pause_mode: PauseMode = Field("keep", description="How start pauses a fleet the trainer has not paused.")
    verify: bool = Field(True, description="After a named finish, check versions and weight checksums agree.")

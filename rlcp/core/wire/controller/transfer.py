"""Broadcast weight updates (`/v1/rl/weight_transfer/*`): the trainer's calls, and the group it
formed with the fleet as the state document shows it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rlcp.core.wire.base import StrictBody
from rlcp.core.wire.versions import VersionName


class TransferInitRequest(StrictBody):
    init_info: dict[str, Any] = Field(
        description="The trainer's init info for the workers (vLLM's "
        "WeightTransferInitRequest; for a fleet of SGLang servers, SGLang's group fields: "
        "master_address, master_port, world_size, and optionally backend and group_name). "
        "`world_size` must be 1 + the fleet's inference ranks; the controller sets each "
        "worker's `rank_offset`."
    )


class TransferUpdateRequest(StrictBody):
    update_info: dict[str, Any] | list[dict[str, Any]] = Field(
        description="One update chunk (or a list), passed to every worker."
    )


class TransferFinishRequest(StrictBody):
    weight_version: VersionName | None = Field(None, description="Names the new weights on every worker.")
    checkpoint_path: str | None = Field(
        None,
        min_length=1,
        description="A disk copy of these weights, loaded into workers that join before the next init.",
    )


class TransferMember(BaseModel):
    worker_id: str
    rank_offset: int
    world_size: int


class TransferGroupView(BaseModel):
    """The weight-transfer group the trainer formed with the fleet (rank 0 is the trainer)."""

    membership_epoch: int = Field(description="The membership it was formed with; another one makes it stale.")
    stale: bool = Field(description="Membership changed since init: the next update is refused (409).")
    world_size: int
    members: list[TransferMember]
    updating: bool = Field(description="Between start_weight_update and finish_weight_update.")
    chunks: int = Field(description="Update chunks received in the current update.")

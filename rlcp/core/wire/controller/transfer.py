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


class MembershipDelta(BaseModel):
    """How the fleet differs from the members a weight-transfer group was formed with: what a
    409 `membership_changed` names (its error object carries these fields beside `code` and
    `message`) and what the state shows of a stale group. A trainer re-forms the group from it
    (`rlcp.rl.sync.BroadcastSync`) and logs who moved."""

    joined: list[str] = Field(description="Members added since init (not in the group: they have no rank).")
    left: list[str] = Field(description="Members of the group the fleet no longer has.")
    restarted: list[str] = Field(
        description="Members of the group that are not the process that joined: a new instance id, "
        "or a spec discovery changed (either way the group's rank there is gone)."
    )
    group_epoch: int = Field(description="The membership epoch the group was formed at.")
    membership_epoch: int = Field(description="The fleet's membership epoch now.")

    def describe(self) -> str:
        """One line for messages and logs: who joined, left or restarted."""
        named = [
            f"{what}: {', '.join(ids)}"
            for what, ids in (("joined", self.joined), ("left", self.left), ("restarted", self.restarted))
            if ids
        ]
        # A member that left and came back unchanged moves the epoch and names no one.
        return "; ".join(named) or (
            f"membership epoch is {self.membership_epoch}, the group was formed at {self.group_epoch}"
        )


class TransferGroupView(BaseModel):
    """The weight-transfer group the trainer formed with the fleet (rank 0 is the trainer)."""

    membership_epoch: int = Field(description="The membership it was formed with; another one makes it stale.")
    stale: bool = Field(description="Membership changed since init: the next update is refused (409).")
    change: MembershipDelta | None = Field(
        None, description="What changed since init, when stale (the same the 409 names); null otherwise."
    )
    world_size: int
    members: list[TransferMember]
    updating: bool = Field(description="Between start_weight_update and finish_weight_update.")
    chunks: int = Field(description="Update chunks received in the current update.")

"""Weight updates from disk (`POST /v1/rl/update_weights`): the source, the checkpoint the fleet
knows of, all at once or in rolling waves; and the gateway's staleness bound (`PUT /v1/rl/staleness`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.base import StrictBody
from rlcp.core.wire.versions import VersionName

# The gateway's staleness bound admits at most this many versions before the desired one; the
# desired state keeps one more applied version than that, so every bound has versions to count.
STALENESS_BOUND_MAX = 31


class DiskSource(StrictBody):
    kind: Literal["disk"] = "disk"
    path: str = Field(min_length=1, description="Safetensors directory every worker can read.")


class BroadcastSource(StrictBody):
    """Weights that arrived over a weight-transfer group (NCCL, or gloo on CPU)."""

    kind: Literal["broadcast"] = "broadcast"


class Checkpoint(StrictBody):
    """A disk copy of a weight version: what a worker that missed a broadcast loads."""

    path: str = Field(min_length=1)
    version: VersionName


class AllAtOnce(StrictBody):
    """Every member at once: one pause, one load, one resume (the whole fleet is out of
    service for the update)."""

    type: Literal["all_at_once"] = "all_at_once"


class Rolling(StrictBody):
    """Waves of at most `max_unavailable` members: each wave leaves the gateway's serving set,
    is updated and verified, and returns before the next one leaves; the others keep serving
    (at the version the staleness bound admits)."""

    type: Literal["rolling"] = "rolling"
    max_unavailable: (
        Annotated[int, Field(strict=True, ge=1, le=100_000)] | Annotated[str, Field(pattern=r"^(100|[1-9][0-9]?)%$")]
    ) = Field(
        1,
        description="Members out of service at once: a count, or a percentage of the members "
        "('25%', rounded down, at least 1).",
    )


UpdateStrategy = Annotated[AllAtOnce | Rolling, Field(discriminator="type")]


class UpdateWeightsRequest(StrictBody):
    version: VersionName = Field(description="The new weight version.")
    source: DiskSource
    pause_mode: PauseMode = Field("keep", description="How in-flight requests are paused during the update.")
    verify: bool = Field(True, description="Check every member reports the version and checksums agree.")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of each phase, in seconds.")
    strategy: UpdateStrategy = Field(default_factory=AllAtOnce, description="All members at once, or rolling waves.")
    wait: bool = Field(
        True,
        description="false: answer 202 at once with the running operation; follow it at `GET /v1/rl/operations/{id}`.",
    )
    expected_checksums: dict[str, str] | None = Field(
        None,
        min_length=1,
        description="A manifest of this version's weight checksums, as the workers name them "
        "(`POST /weight_checker` `checksum`): every member is checked against it, not only against the others. "
        "Needs `verify`.",
    )

    @field_validator("expected_checksums")
    @classmethod
    def _manifest_needs_verify(cls, value: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        if value is not None and info.data.get("verify") is False:
            raise ValueError("needs verify: true (a manifest is checked by verification)")
        return value


class StalenessRequest(StrictBody):
    bound: int = Field(
        ge=0, le=STALENESS_BOUND_MAX, description="How many versions before the desired one the gateway may serve."
    )

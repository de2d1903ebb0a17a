"""Weight updates on one agent: a reload from disk (vLLM's `/update_weights` shape, or the one-call
`/v1/agent/weights/update`), the version it is named by and the one the agent is told to expect."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.agent.state import AgentState
from rlcp.core.wire.base import StrictBody
from rlcp.core.wire.versions import VersionName


class DiskUpdateRequest(StrictBody):
    """Reload every weight from a safetensors directory and name the result `version`."""

    path: str = Field(min_length=1, description="Directory with *.safetensors files, under an allowed root.")
    version: VersionName = Field(description="Weight version to report after the reload.")
    reset_prefix_cache: bool = Field(True, description="Drop prefix-cache blocks computed with the old weights.")
    checksums: bool = Field(
        False,
        description="Also compute the new weights' checksums and answer them (saves "
        "the controller a round trip when it verifies).",
    )


class DesiredVersionRequest(StrictBody):
    """The fleet's desired weight version; `/readyz` is 503 while the applied one differs."""

    weight_version: VersionName | None = Field(description="Desired version, or null to stop gating readiness.")


class PrepareRequest(StrictBody):
    """The first step of a controller's update: learn the desired version, then pause."""

    desired_weight_version: VersionName | None = Field(description="As `PUT /v1/agent/desired`.")
    weights_path: str | None = Field(
        None,
        min_length=1,
        description="A checkpoint about to be loaded: checked "
        "as `POST /v1/agent/weights/check` first, and nothing changes (no desired "
        "version, no pause) unless it is loadable.",
    )
    mode: PauseMode = Field("keep", description="abort | wait | keep, as `POST /pause`.")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of the pause, in seconds.")


class WeightsUpdateRequest(StrictBody):
    """A controller's whole disk update in one call: the checkpoint checked (as
    `POST /v1/agent/weights/check`: nothing changes unless it is loadable), the desired version
    learnt, generation paused (unless it already is), the weights reloaded and named, their
    checksums taken, and generation resumed when `resume` says so."""

    path: str = Field(min_length=1, description="As `POST /v1/agent/weights/disk`.")
    version: VersionName = Field(description="The version to load the weights as; also the desired version.")
    mode: PauseMode = Field("keep", description="abort | wait | keep, as `POST /pause`.")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of the pause, in seconds.")
    checksums: bool = Field(False, description="Answer the new weights' checksums.")
    resume: bool = Field(False, description="Resume once loaded (false: stay paused until told).")
    expected_checksums: dict[str, str] | None = Field(
        None,
        description="With `resume`: resume only if the new weights agree with these, tensor by tensor "
        "(each one named here present and equal; a checksum of no bytes on either side is not "
        "compared). Otherwise stay paused and say why (`held_back`).",
    )


class UpdateWeightVersionRequest(StrictBody):
    new_version: VersionName


class VersionSetAnswer(BaseModel):
    success: Literal[True]
    new_version: str


class WeightInfoAnswer(BaseModel):
    weight_version: str | None


class DiskUpdatedAnswer(BaseModel):
    status: Literal["updated"]
    weight_version: str | None
    checksums: dict[str, str] | None = Field(
        None,
        description="The new weights' checksums, when asked for ("
        "the keys of `ChecksumsAnswer`; a weight reload "
        "evicts adapters, so none are held here).",
    )


class WeightsUpdatedAnswer(BaseModel):
    status: Literal["updated"]
    weight_version: str | None
    checksums: dict[str, str] | None = Field(None, description="As in `DiskUpdatedAnswer`, when asked for.")
    resumed: bool = Field(description="Whether generation was resumed in this call.")
    held_back: str | None = Field(
        None,
        description="Why it was not resumed although asked to: the checksums that disagree with `expected_checksums`.",
    )
    state: AgentState = Field(description="The agent's state after the call, as `GET /v1/agent/state`.")

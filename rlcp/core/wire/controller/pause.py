"""Pause and resume (`POST /v1/rl/pause`, `/v1/rl/resume`), the whole fleet or the members a
label selector names."""

from __future__ import annotations

from pydantic import Field

from rlcp.core.labels import MAX_SELECTOR_CHARS
from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.base import StrictBody

SELECTOR_FIELD = Field(
    None,
    max_length=MAX_SELECTOR_CHARS,
    description="A Kubernetes label selector (`role=policy`, `tier in "
    "(a,b)`, `!canary`, comma = AND): only the matching members are touched, and held so (paused) "
    "or released (resumed) in the desired state; none matching is a 422.",
)


class PauseRequest(StrictBody):
    mode: PauseMode = "keep"
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline to quiesce, in seconds.")
    selector: str | None = SELECTOR_FIELD


class ResumeRequest(StrictBody):
    selector: str | None = SELECTOR_FIELD

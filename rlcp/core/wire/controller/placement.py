"""Placement (`GET/PUT /v1/rl/placement`): how many agents the controller keeps as Ray actors."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from rlcp.core.wire.base import StrictBody


class PlacementRequest(StrictBody):
    replicas: int | None = Field(
        ge=0,
        description="Agents to keep placed (at most placement.ray.max_replicas); null "
        "hands the count back to the settings' placement.ray.replicas.",
    )


class PlacementView(BaseModel):
    """What placement keeps and what it last saw (GET/PUT /v1/rl/placement)."""

    kind: Literal["none", "ray"]
    replicas: int | None = Field(description="Agents to keep placed; null when placement.kind is none.")
    replicas_from: Literal["settings", "api"] | None = Field(
        description="Where `replicas` comes from: the settings, or the desired state an API call set."
    )
    max_replicas: int | None = None
    placed: list[str] = Field(
        default_factory=list,
        description="Agent actors alive after the last pass, by name (discovery's members say which of them serve).",
    )
    groups: list[str] = Field(default_factory=list, description="Placement groups after the last pass.")
    leading: bool = Field(description="Only the leader places; a follower's view is what it last saw leading.")
    last_pass_at: datetime | None = None
    last_pass_s: float | None = Field(None, description="How long the last pass took.")
    last_error: str | None = Field(
        None, description="Why the last pass failed (retried at the next interval); null when it succeeded."
    )

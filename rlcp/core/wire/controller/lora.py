"""LoRA adapters (`POST /v1/rl/loras`, `DELETE /v1/rl/loras/{name}`), and an adapter as the desired
state keeps it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from rlcp.core.wire.base import StrictBody
from rlcp.core.wire.versions import VersionName


class LoraRequest(StrictBody):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/-]+$")
    path: str = Field(min_length=1)
    version: VersionName | None = None
    verify: bool = Field(
        True,
        description="Check the adapter's tensors agree across the workers whose checksums "
        "cover adapters (the agent's).",
    )


class LoraSpec(BaseModel):
    path: str
    version: VersionName | None = None

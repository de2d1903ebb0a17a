"""vLLM's weight-transfer routes on one agent (init, one update chunk, finish): the broadcast path."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlcp.core.wire.base import StrictBody
from rlcp.core.wire.versions import VersionName


class InitWeightTransferRequest(StrictBody):
    init_info: dict[str, Any] = Field(description="Backend-specific init info (vLLM's WeightTransferInitRequest).")


class WeightTransferUpdateRequest(StrictBody):
    update_info: dict[str, Any] | list[dict[str, Any]] = Field(
        description="Backend-specific update chunk, or a list of them (vLLM's WeightTransferUpdateRequest)."
    )


class FinishWeightUpdateRequest(StrictBody):
    weight_version: VersionName | None = None

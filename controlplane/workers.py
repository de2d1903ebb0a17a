"""Who the workers are: the spec discovery produces and every layer above consumes."""

from __future__ import annotations

from typing import Literal, NewType

from pydantic import BaseModel, ConfigDict, Field

WorkerId = NewType("WorkerId", str)
Flavor = Literal["agent", "vllm", "dynamo"]


class WorkerSpec(BaseModel):
    """One member of the fleet, as discovered. Immutable: a change is a new spec."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, description="Stable worker id (instance id, pod name, ...).")
    admin_url: str = Field(description="Base URL of the worker's admin API.")
    inference_url: str | None = Field(None, description="Base URL serving inference, if known.")
    flavor: Flavor = Field("agent", description="Which AdminAPI speaks to it.")
    world_size: int = Field(1, ge=1, description="Inference ranks behind this worker (TP x PP x DP).")
    model: str | None = None

"""`GET /v1/models`, as the gateway and the facade answer it (OpenAI's list of models)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class ModelCard(BaseModel):
    """vLLM's model card (members' own cards pass through: `root`, `max_model_len`, ...)."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["model"]
    owned_by: str
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]

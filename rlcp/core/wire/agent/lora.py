"""LoRA adapters on one agent: loading one (vLLM's `/v1/load_lora_adapter` shape) and removing it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rlcp.core.wire.agent.state import AgentState, LoraInfo
from rlcp.core.wire.base import StrictBody
from rlcp.core.wire.versions import VersionName


class LoraLoadRequest(StrictBody):
    """Load an adapter, or hot-swap the one already loaded under `name`."""

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:/-]+$",
        description="Adapter name; inference requests select it as `model`.",
    )
    path: str = Field(min_length=1, description="PEFT adapter directory, under an allowed root.")
    version: VersionName | None = Field(None, description="Version label carried in state.")
    checksums: bool = Field(
        False,
        description="Also answer the adapter's checksums as the engine holds it (the "
        "`lora:<name>:` keys of `ChecksumsAnswer`) and the agent's state: "
        "a controller verifying the load needs no other call.",
    )


class LoraLoadedAnswer(LoraInfo):
    checksums: dict[str, str] | None = Field(None, description="With `checksums`: the adapter's tensors' checksums.")
    state: AgentState | None = Field(None, description="With `checksums`: the agent's state after the load.")


class UnloadedAnswer(BaseModel):
    status: Literal["unloaded"]
    name: str
    engine_adapter_ids: list[int] = Field(description="Adapter ids the engine still holds.")

"""Weight checksums: how an agent names each tensor's sha256 (LoRA tensors included), the one rule
for holding them to a manifest, and the weight checker's requests and answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rlcp.core.wire.base import StrictBody


class WeightsCheckRequest(StrictBody):
    """Could a load of this directory start now? Read-only: no engine call, no lock."""

    path: str = Field(min_length=1, description="As `POST /v1/agent/weights/disk` (or `/v1/agent/loras`).")
    kind: Literal["weights", "adapter"] = Field(
        "weights", description="A safetensors checkpoint of the model, or a PEFT adapter directory."
    )


class WeightsCheckAnswer(BaseModel):
    path: str = Field(description="The directory, resolved.")
    files: int = Field(description="Safetensors files found (0 for an adapter).")
    tensors: int = Field(description="Tensors their headers name (0 for an adapter).")


class WeightCheckerRequest(StrictBody):
    action: Literal["checksum", "reset", "compare"]
    baseline: dict[str, str] | None = None


# The agent's checksums cover the LoRA adapters its engine holds as well as the base weights
# (vLLM's own checksum route leaves adapters out): one key per adapter tensor, `lora:<adapter
# name>:<tensor key>`. The tensor key is shaped like a base key (on vLLM its rank prefix and
# dotted tensor name, e.g. `dp0:pp0:pcp0:tp0:model.layers.0.self_attn.qkv_proj.lora_b.2`), and
# no base key starts with `lora:` (parameter names have no ':'). Adapter names may contain ':';
# tensor names never do.
LORA_CHECKSUM_PREFIX = "lora:"


CHECKSUMS_DESCRIPTION = (
    "Per tensor, a sha256 of its bytes: the base weights (as vLLM's keys; on vLLM's CPU engine "
    "a linear layer's weight is read back from its kernel, laid out as vLLM loads it) and every "
    "LoRA adapter the engine holds, as `lora:<adapter name>:<tensor key>`, from the engine's "
    "copy in memory."
)


# sha256(b""): the checksum of a tensor of no bytes, such as the parameters vLLM's CPU engine empties
# when it moves a linear layer's weight into its kernel. It tells no two weight versions apart, so
# verification counts such a tensor as not compared rather than as agreeing.
EMPTY_TENSOR_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def lora_checksum_key(adapter: str, tensor: str) -> str:
    return f"{LORA_CHECKSUM_PREFIX}{adapter}:{tensor}"


def checksums_disagree(sums: dict[str, str], expected: dict[str, str], *, named: int = 3) -> str | None:
    """How `sums` fails `expected` (each tensor `expected` names present and equal; a checksum of
    no bytes on either side tells nothing and is not compared), or None when it does not. The one
    rule for a manifest: the controller's verification holds every worker to it, and an agent told
    to resume only on agreement holds itself to it."""
    missing = sorted(k for k in expected if k not in sums)
    differ = sorted(
        k
        for k in expected
        if k in sums and sums[k] != expected[k] and EMPTY_TENSOR_SHA256 not in (sums[k], expected[k])
    )
    if not missing and not differ:
        return None
    parts = []
    if differ:
        parts.append(
            f"{len(differ)} of {len(expected)} tensors differ ({', '.join(differ[:named])}"
            f"{', ...' if len(differ) > named else ''})"
        )
    if missing:
        parts.append(
            f"{len(missing)} named tensors are missing ({', '.join(missing[:named])}"
            f"{', ...' if len(missing) > named else ''})"
        )
    return "; ".join(parts)


class ChecksumsAnswer(BaseModel):
    checksums: dict[str, str] = Field(description=CHECKSUMS_DESCRIPTION)


class CompareAnswer(BaseModel):
    match: bool
    mismatches: list[str] = Field(description="Tensors whose checksum differs from the baseline.")

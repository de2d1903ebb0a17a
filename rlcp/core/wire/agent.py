"""Wire models of the agent's admin API.

These are the shapes on the admin port, importable without vLLM or torch: the
controller's `agent` flavor parses agent responses with them, and the OpenAPI
document is generated from them. Request bodies forbid unknown fields so a typo
is a 422 naming the field rather than a silently ignored option.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rlcp.core.wire.versions import VersionName

PauseMode = Literal["abort", "wait", "keep"]

# On an agent's inference port: a request carrying this header is served only while the
# agent's weights are at that version, else refused 409 `weight_version_mismatch` before the
# engine sees it. The gateway sets it to the version its fence admitted the worker at, so a
# worker that restarted (or changed weights) since the controller last read it is skipped.
EXPECT_VERSION_HEADER = "X-RL-Expect-Weight-Version"
# On a non-streamed answer: which weights sampled which output tokens, as the engine tracked
# them; JSON, one list of `{"version", "start", "end"}` spans per choice (end exclusive).
WEIGHT_VERSIONS_HEADER = "X-RL-Weight-Versions"
VERSION_MISMATCH = "weight_version_mismatch"
# An agent's inference answers when its engine is dead: on arrival, a 503 with this error code
# (the request never reached an engine, another worker may take it); the 5xx of a request during
# which the engine died carries the header (the request may be what killed it: not resent).
ENGINE_DEAD = "engine_dead"
ENGINE_DIED_HEADER = "X-RL-Engine-Died"
# The agent's exit status once its engine has died (`exit_on_engine_death`): its supervisor restarts it.
EXIT_ENGINE_DIED = 3


def weight_versions_header(choices: list[list[tuple[str, int, int]]]) -> str:
    """The `X-RL-Weight-Versions` value for these (version, start, end) spans, per choice."""
    return json.dumps(
        [[{"version": v, "start": start, "end": end} for v, start, end in spans] for spans in choices],
        separators=(",", ":"),
    )


def version_mismatch_body(expected: str, served: str | None) -> dict[str, dict[str, str]]:
    return {
        "error": {
            "code": VERSION_MISMATCH,
            "field": EXPECT_VERSION_HEADER,
            "message": f"this worker's weights are at {served!r}, not {expected!r}",
        }
    }


def paused_refusal_body(expected: str) -> dict[str, dict[str, str]]:
    """A request for named weights arriving while the worker is paused: it would wait in the
    queue and may run after an update, on other weights; refused as a mismatch, so the gateway
    (or Envoy's retry) sends it to a worker in service."""
    return {
        "error": {
            "code": VERSION_MISMATCH,
            "field": EXPECT_VERSION_HEADER,
            "message": f"this worker is paused (an update may change its weights before the request "
            f"runs): not taken for weights {expected!r}",
        }
    }


def weights_changed_body(expected: str, served: str | None) -> dict[str, dict[str, str]]:
    """A request for named weights that waited in the engine's queue (admitted before a pause)
    while the weights changed: it would be computed by the new ones under the old label, so it
    is refused before its first token goes out, as a mismatch (the gateway, or Envoy's retry,
    sends it to a worker with the weights it was admitted for)."""
    return {
        "error": {
            "code": VERSION_MISMATCH,
            "field": EXPECT_VERSION_HEADER,
            "message": f"this worker's weights changed to {served!r} before the request's first token: "
            f"not computed for weights {expected!r}",
        }
    }


def engine_dead_body() -> dict[str, dict[str, str]]:
    return {
        "error": {
            "code": ENGINE_DEAD,
            "message": "this worker's engine has died (it is being restarted); the request did not reach it",
        }
    }


OperationKind = Literal[
    "pause",
    "resume",
    "abort_requests",
    "update_weights_from_disk",
    "load_lora",
    "unload_lora",
    "update_weight_version",
    "init_weight_transfer",
    "start_weight_update",
    "update_weights",
    "finish_weight_update",
    "shutdown_weight_transfer",
    "weight_checker",
    "set_desired",
    "sleep",
    "wake_up",
    "reset_prefix_cache",
]
OperationStatus = Literal["ok", "error", "timeout", "cancelled"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DiskUpdateRequest(_Body):
    """Reload every weight from a safetensors directory and name the result `version`."""

    path: str = Field(min_length=1, description="Directory with *.safetensors files, under an allowed root.")
    version: VersionName = Field(description="Weight version to report after the reload.")
    reset_prefix_cache: bool = Field(True, description="Drop prefix-cache blocks computed with the old weights.")
    checksums: bool = Field(
        False,
        description="Also compute the new weights' checksums and answer them (saves "
        "the controller a round trip when it verifies).",
    )


class WeightsCheckRequest(_Body):
    """Could a load of this directory start now? Read-only: no engine call, no lock."""

    path: str = Field(min_length=1, description="As `POST /v1/agent/weights/disk` (or `/v1/agent/loras`).")
    kind: Literal["weights", "adapter"] = Field(
        "weights", description="A safetensors checkpoint of the model, or a PEFT adapter directory."
    )


class WeightsCheckAnswer(BaseModel):
    path: str = Field(description="The directory, resolved.")
    files: int = Field(description="Safetensors files found (0 for an adapter).")
    tensors: int = Field(description="Tensors their headers name (0 for an adapter).")


class LoraLoadRequest(_Body):
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


class DesiredVersionRequest(_Body):
    """The fleet's desired weight version; `/readyz` is 503 while the applied one differs."""

    weight_version: VersionName | None = Field(description="Desired version, or null to stop gating readiness.")


class PrepareRequest(_Body):
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


class WeightsUpdateRequest(_Body):
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


class UpdateWeightVersionRequest(_Body):
    new_version: VersionName


class InitWeightTransferRequest(_Body):
    init_info: dict[str, Any] = Field(description="Backend-specific init info (vLLM's WeightTransferInitRequest).")


class WeightTransferUpdateRequest(_Body):
    update_info: dict[str, Any] | list[dict[str, Any]] = Field(
        description="Backend-specific update chunk, or a list of them (vLLM's WeightTransferUpdateRequest)."
    )


class FinishWeightUpdateRequest(_Body):
    weight_version: VersionName | None = None


class AbortRequestsRequest(_Body):
    request_ids: list[str] | None = Field(None, description="External request ids; empty or null aborts all.")


class WeightCheckerRequest(_Body):
    action: Literal["checksum", "reset", "compare"]
    baseline: dict[str, str] | None = None


class RequestCounts(BaseModel):
    running: int = 0
    waiting: int = 0
    frozen: int = Field(0, description="Requests held in the engine by a keep-mode pause.")


class LoraInfo(BaseModel):
    name: str
    version: str | None = None
    path: str
    adapter_id: int
    loaded_at: datetime


class LoraLoadedAnswer(LoraInfo):
    checksums: dict[str, str] | None = Field(None, description="With `checksums`: the adapter's tensors' checksums.")
    state: AgentState | None = Field(None, description="With `checksums`: the agent's state after the load.")


class OperationRecord(BaseModel):
    id: str
    kind: OperationKind
    status: OperationStatus
    started_at: datetime
    duration_s: float
    message: str | None = None


class AgentState(BaseModel):
    """Everything a controller needs from one agent, read in one call."""

    agent_id: str
    instance_id: str = Field(description="Random per agent process: a new value means the agent restarted.")
    model: str
    engine: Literal["vllm", "sim"]
    engine_alive: bool
    ready: bool
    not_ready_reason: str | None = None
    paused: bool
    sleeping: bool = Field(
        False,
        description="The engine is asleep (`POST /sleep` at level 1 or 2, not yet fully "
        "woken): its memory is released, it serves nothing, and it reports not ready.",
    )
    requests: RequestCounts
    weight_version: str | None
    desired_weight_version: str | None = None
    loras: list[LoraInfo] = Field(default_factory=list)
    lora_enabled: bool | None = Field(
        None, description="The engine was started with LoRA support (`--enable-lora`); None: not reported."
    )
    max_loras: int | None = Field(
        None,
        description="Adapters the engine holds at once (`--max-loras`); vLLM evicts the oldest past it, "
        "silently. None: not reported, or LoRA off.",
    )
    world_size: int
    busy_with: OperationKind | None = Field(None, description="The mutating operation running now, if any.")
    last_operations: list[OperationRecord] = Field(default_factory=list)
    inference_url: str | None = None


class _Query(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PauseQuery(_Query):
    mode: PauseMode = Field("abort", description="abort | wait | keep (vLLM's default is abort).")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of the pause, in seconds.")
    clear_cache: bool = Field(True, description="Accepted for vLLM compatibility (deprecated there).")


class SleepQuery(_Query):
    """vLLM's `POST /sleep` query (its dev route), plus a deadline."""

    level: int = Field(
        1,
        ge=0,
        le=2,
        description="0 pauses scheduling only; 1 offloads the weights and drops the KV cache; 2 discards both.",
    )
    mode: PauseMode = Field(
        "abort", description="What happens to running requests as the engine pauses (vLLM's default is abort)."
    )
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of the sleep, in seconds.")


class WakeUpQuery(BaseModel):
    """vLLM's `POST /wake_up` query: `tags` repeated (`?tags=weights&tags=kv_cache`), none for all."""

    model_config = ConfigDict(extra="ignore")
    tags: list[Literal["weights", "kv_cache", "scheduling"]] = Field(default_factory=list)


class ResetPrefixCacheQuery(_Query):
    """vLLM's `POST /reset_prefix_cache` query (its dev route)."""

    reset_running_requests: bool = Field(
        False,
        description="Preempt running requests so their blocks can be "
        "dropped too (they are recomputed); without it the reset fails while any "
        "request holds blocks.",
    )
    reset_external: bool = Field(False, description="Also reset an external (KV-connector) prefix cache.")


class ResetPrefixCacheAnswer(BaseModel):
    success: bool = Field(description="False: blocks were still held, nothing was dropped (vLLM's answer).")


class WorldSizeQuery(_Query):
    include_dp: bool = True


# -- answers: the small shapes of vLLM's RL routes, which handlers build as dicts --------
class StatusAnswer(BaseModel):
    status: str


class MessageAnswer(BaseModel):
    message: str


class IsPausedAnswer(BaseModel):
    is_paused: bool


class SleepAnswer(BaseModel):
    status: Literal["sleeping"]
    level: int


class WakeUpAnswer(BaseModel):
    status: Literal["awake", "sleeping"] = Field(description="sleeping: a partial wake, allocations remain asleep.")
    tags: list[str] | None


class IsSleepingAnswer(BaseModel):
    is_sleeping: bool = Field(
        description="Memory released and not yet woken (unlike vLLM's own route, false while merely paused)."
    )


class AbortedAnswer(BaseModel):
    status: Literal["aborted"]
    aborted: int = Field(description="Requests aborted.")


class VersionSetAnswer(BaseModel):
    success: Literal[True]
    new_version: str


class WeightInfoAnswer(BaseModel):
    weight_version: str | None


class WorldSizeAnswer(BaseModel):
    world_size: int


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


class UnloadedAnswer(BaseModel):
    status: Literal["unloaded"]
    name: str
    engine_adapter_ids: list[int] = Field(description="Adapter ids the engine still holds.")


class ProbeAnswer(BaseModel):
    status: str
    reason: str | None = None

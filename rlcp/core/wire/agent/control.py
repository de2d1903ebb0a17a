"""Pause, resume, sleep, wake_up, the prefix-cache reset and abort: the routes that hold or free an
engine without changing its weights, with vLLM's query strings and answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rlcp.core.wire.base import LenientQuery, StrictBody

PauseMode = Literal["abort", "wait", "keep"]


class AbortRequestsRequest(StrictBody):
    request_ids: list[str] | None = Field(None, description="External request ids; empty or null aborts all.")


class PauseQuery(LenientQuery):
    mode: PauseMode = Field("abort", description="abort | wait | keep (vLLM's default is abort).")
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of the pause, in seconds.")
    clear_cache: bool = Field(True, description="Accepted for vLLM compatibility (deprecated there).")


class SleepQuery(LenientQuery):
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


class ResetPrefixCacheQuery(LenientQuery):
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

"""Sleep, wake_up and the prefix-cache reset (`POST /v1/rl/sleep`, `/v1/rl/wake_up`,
`/v1/rl/reset_prefix_cache`): the fleet operations that free or drop an engine's memory, and the
record of a member kept asleep."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool

from rlcp.core.labels import MAX_SELECTOR_CHARS
from rlcp.core.wire.base import StrictBody

# A strict int, not `Literal[1, 2]`: a literal of ints matches `true` and `1.0` (they compare
# and hash equal to 1), so `{"level": true}` would put members to sleep.
SleepLevel = Annotated[int, Field(strict=True, ge=1, le=2, json_schema_extra={"enum": [1, 2]})]


WakeTag = Literal["weights", "kv_cache"]


WORKER_IDS_FIELD = Field(
    None,
    min_length=1,
    max_length=1024,
    description="Members by id (every one must be a "
    "member: an unknown id is a 404 naming it); give this or `selector`, not both.",
)


class SleepRequest(StrictBody):
    """`POST /v1/rl/sleep`: the members named (by `selector` or `worker_ids`; neither: every
    member) leave the gateway's fence, are put to sleep, and are kept asleep in the desired
    state until `POST /v1/rl/wake_up` wakes and verifies them."""

    level: SleepLevel = Field(
        1,
        description="vLLM's sleep level: 1 offloads the weights to host memory and drops "
        "the KV cache; 2 discards both (the weights are reloaded from the fleet's checkpoint "
        "on wake).",
    )
    mode: Literal["abort", "wait"] = Field(
        "abort",
        description="What happens to requests still running on the "
        "member as it falls asleep (vLLM's sleep `mode`): abort them, or wait "
        "for them to finish (bounded by `timeout_s`).",
    )
    timeout_s: float | None = Field(None, gt=0, le=3600, description="Deadline of each member's sleep, in seconds.")
    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A label selector: only the matching members (none matching is a 422).",
    )
    worker_ids: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = WORKER_IDS_FIELD


class WakeUpRequest(StrictBody):
    """`POST /v1/rl/wake_up`: wake the members named (neither `selector` nor `worker_ids`:
    every sleeping member), verify each, and return those that pass to service."""

    tags: list[WakeTag] | None = Field(
        None,
        min_length=1,
        max_length=2,
        description="vLLM's wake_up `tags`: wake "
        "only these allocations (`weights`, `kv_cache`). A partial wake leaves the "
        "members asleep (out of the fence, not verified); null or both: a full wake.",
    )
    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A label selector: only the matching sleeping members (none matching is a 422).",
    )
    worker_ids: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = WORKER_IDS_FIELD


class ResetPrefixCacheRequest(StrictBody):
    """`POST /v1/rl/reset_prefix_cache`: every member in service (with `selector`, the matching
    ones) drops its prefix cache."""

    reset_running_requests: StrictBool = Field(
        False,
        description="Preempt running requests so their blocks are "
        "dropped too (vLLM recomputes them); without it a member whose "
        "requests hold blocks fails the reset.",
    )
    reset_external: StrictBool = Field(False, description="Also reset an external (KV-connector) prefix cache.")
    selector: str | None = Field(
        None,
        max_length=MAX_SELECTOR_CHARS,
        description="A label selector: only the matching members (none matching is a 422).",
    )


class SleepRecord(BaseModel):
    """A member kept asleep, and what its wake is checked against."""

    level: SleepLevel
    weight_version: str | None = Field(description="The version it held when it went to sleep.")
    checksums_digest: str | None = Field(
        None,
        description="A digest of its weight checksums taken just before it "
        "slept, where its flavor computes them: a wake at the same version must "
        "give the same digest.",
    )
    since: datetime

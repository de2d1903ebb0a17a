"""The guarded engine passthrough (`POST /v1/rl/engine/{route}`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlcp.core.labels import MAX_SELECTOR_CHARS
from rlcp.core.wire.base import StrictBody


class EngineRouteRequest(StrictBody):
    """`POST /v1/rl/engine/{route}`: one allowlisted engine route on one worker, the members a
    selector names, or (neither given) the whole fleet."""

    worker: str | None = Field(None, min_length=1, max_length=253, description="One member, by id.")
    selector: str | None = Field(
        None, max_length=MAX_SELECTOR_CHARS, description="A label selector: the matching members."
    )
    body: dict[str, Any] | None = Field(
        None, description="The JSON body sent to a POST route as it is (none for a GET route)."
    )

"""The shapes every route group of both APIs (the agent's and the controller's) builds on.

A request body forbids unknown fields, so a typo is a 422 naming the field before any worker is
touched, not a silently ignored option; a query string, shaped like vLLM's, ignores parameters it
does not know (vLLM's own routes do).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictBody(BaseModel):
    """A request body: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class LenientQuery(BaseModel):
    """A query string as vLLM reads it: unknown parameters are ignored."""

    model_config = ConfigDict(extra="ignore")


class EmptyRequest(StrictBody):
    """A route that takes no fields: an empty body or `{}`."""

"""What a client is answered when the gateway could not get it an answer from a worker (the
error shape is the kernel's, from the error middleware; `rlcp.core.errors`)."""

from __future__ import annotations

from rlcp.core.errors import ApiError


class NoCapacity(ApiError):
    """503: nothing could serve within the hold deadline (or the hold queue is full)."""

    status = 503
    code = "no_capacity"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class UpstreamFailed(ApiError):
    """502: every worker tried failed before answering."""

    status = 502
    code = "upstream_failed"


class EngineDied(ApiError):
    """502: the worker's engine died while serving this request (not resent: `retry.py`)."""

    status = 502
    code = "engine_died"

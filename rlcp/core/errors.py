"""The HTTP error taxonomy both processes build on, translated to the JSON error shape in
one middleware (`rlcp.core.http`).

    ApiError                   -> its own status, {"error": {"code", "message", "field"?}}
    ├── BadRequestError   400/422  a field is missing, malformed or out of range
    │   └── UnavailablePathError 400  a path inside the roots that is not there (yet), unreadable,
    │                                 or holds no weights: `path_unavailable`, retried by a controller
    ├── UnauthorizedError 401      missing or wrong bearer token
    ├── ForbiddenPathError 403     a path resolves outside the allowed roots
    ├── NotFoundError     404      no such LoRA, route, ...
    ├── ConflictError     409      another mutating operation is running
    ├── PayloadTooLargeError 413   the body is over the limit (as sent, or once decoded)
    └── UnsupportedEncodingError 415  a Content-Encoding the process does not take

Each process adds its own leaves (`rlcp.agent.errors`: the engine's 502/503/504;
`rlcp.controlplane.api.errors`: the controller's domain errors mapped to these).
Handlers raise these; none has its own catch-all.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# The error shape as `ApiError.body` builds it: {"error": {"code", "message", "field"?, ...}}, where an
# error adds its own keys to the inner object (`details`: a 409 `not_leader` names the leader, ...).
ErrorJson = dict[str, dict[str, object]]


class ApiError(Exception):
    """An answer in the error shape. A kind of error is declared in one line, its status and code
    as class keywords (`class ConflictError(ApiError, status=409, code="conflict"): ...`); a
    subclass keeps what it does not name."""

    status = 500
    code = "internal"

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, field: str | None = None, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details  # keys the error object carries besides these (the leader, the workers, ...)

    @property
    def headers(self) -> dict[str, str] | None:
        """Headers the answer carries besides the body (a 503's `Retry-After`, ...)."""
        return None

    def body(self) -> ErrorJson:
        detail: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            detail["field"] = self.field
        return {"error": {**detail, **self.details}}


class BadRequestError(ApiError, status=400, code="bad_request"): ...


class UnavailablePathError(BadRequestError, code="path_unavailable"): ...


class ValidationFailedError(BadRequestError, status=422, code="validation_error"): ...


class UnauthorizedError(ApiError, status=401, code="unauthorized"): ...


class ForbiddenPathError(ApiError, status=403, code="path_forbidden"): ...


class NotFoundError(ApiError, status=404, code="not_found"): ...


class ConflictError(ApiError, status=409, code="conflict"): ...


class NotSupportedError(ApiError, status=501, code="not_supported"):
    """501: a route clients know from one vLLM server that has no meaning for a fleet (yet);
    the message names the route and what to do instead."""


class PayloadTooLargeError(ApiError, status=413, code="payload_too_large"): ...


class UnsupportedEncodingError(ApiError, status=415, code="unsupported_encoding"): ...


# -- the shape on the wire ------------------------------------------------------------
class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail

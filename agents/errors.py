"""The HTTP error taxonomy of the agent (and the base the controller's builds on),
translated to the JSON error shape in one middleware (`agents.admin.http`).

    ApiError                   -> its own status, {"error": {"code", "message", "field"?}}
    ├── BadRequestError   400/422  a field is missing, malformed or out of range
    ├── UnauthorizedError 401      missing or wrong bearer token
    ├── ForbiddenPathError 403     a path resolves outside the allowed roots
    ├── NotFoundError     404      no such LoRA, route, ...
    ├── ConflictError     409      another mutating operation is running
    ├── EngineCallError   502      the engine refused or failed a primitive
    ├── EngineDeadError   503      the engine is not alive
    └── DeadlineError     504      an engine call ran past its deadline

Handlers raise these; none has its own catch-all.
"""

from __future__ import annotations


class ApiError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def body(self) -> dict:
        detail: dict = {"code": self.code, "message": self.message}
        if self.field is not None:
            detail["field"] = self.field
        return {"error": detail}


class BadRequestError(ApiError):
    status = 400
    code = "bad_request"


class ValidationFailedError(BadRequestError):
    status = 422
    code = "validation_error"


class UnauthorizedError(ApiError):
    status = 401
    code = "unauthorized"


class ForbiddenPathError(ApiError):
    status = 403
    code = "path_forbidden"


class NotFoundError(ApiError):
    status = 404
    code = "not_found"


class ConflictError(ApiError):
    status = 409
    code = "conflict"


class EngineCallError(ApiError):
    status = 502
    code = "engine_error"


class EngineDeadError(ApiError):
    status = 503
    code = "engine_dead"


class DeadlineError(ApiError):
    status = 504
    code = "deadline_exceeded"

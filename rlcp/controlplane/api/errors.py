"""The controller's domain errors as HTTP, in one table (`rlcp.controlplane.errors` has the tree).

The shared error middleware (`rlcp.core.http`) calls `to_api_error` for anything a handler
raises that is not already an `ApiError`; what is not in the table stays a 500. The keys an
answer carries besides code, message and field are the error's `details` (`rlcp.core.errors`).
"""

from __future__ import annotations

from rlcp.controlplane import errors as domain
from rlcp.core.errors import (
    ApiError,
    BadRequestError,
    ConflictError,
    ForbiddenPathError,
    NotFoundError,
    ValidationFailedError,
)
from rlcp.core.wire.controller.operations import OperationResult


class NotLeaderApiError(ConflictError):
    """409 `not_leader`; the body names the leader, so a client can go there instead."""

    code = "not_leader"


class MissingCapabilityApiError(ConflictError):
    """409 `capability_missing`; the body names each worker and what it lacks."""

    code = "capability_missing"


class MembershipChangedApiError(ConflictError):
    """409 `membership_changed`: the fleet is not the one the weight-transfer group was formed
    with. The body names who moved (`joined`, `left`, `restarted`, and the two epochs: the
    fields of `MembershipDelta`), so a trainer can re-form the group and say why."""

    code = "membership_changed"


class ModelNameTakenApiError(ConflictError):
    """409 `model_name_taken`; the body names the model, the fleet that serves it and the fleet
    that asked for it (nothing was sent to any worker)."""

    code = "model_name_taken"


class CheckpointUnavailableApiError(ValidationFailedError):
    """422 `checkpoint_unavailable`: no worker could load the checkpoint, and none was
    touched; the body names each worker's reason (missing, unreadable, not weights)."""

    code = "checkpoint_unavailable"


class EngineRefusedApiError(ApiError):
    """The 4xx the engines answered a passthrough with, `engine_rejected`; the body names each
    worker and what it answered, and carries the operation (every worker's result)."""

    code = "engine_rejected"

    def __init__(self, message: str, *, status: int, workers: dict[str, str], operation: dict[str, object]) -> None:
        super().__init__(message, workers=workers, operation=operation)
        self.status = status


class FleetCallFailedApiError(ApiError):
    """A call on the vLLM-shaped facade that did not succeed on every member: 502
    `workers_failed`, or 503 `workers_unreachable` when no member could be reached. Never a
    2xx (a 207 there reads as success to vLLM-shaped clients: httpx's `raise_for_status`,
    requests); the body names each failed worker and carries the operation."""

    def __init__(self, result: OperationResult) -> None:
        failed = [r for r in result.results if r.status in ("error", "timeout")]
        unreachable = result.status == "failed" and bool(failed) and all(r.code == "unreachable" for r in failed)
        self.status, self.code = (503, "workers_unreachable") if unreachable else (502, "workers_failed")
        named = "; ".join(f"{r.worker_id} ({r.phase}: {r.message or r.code or r.status})" for r in failed)
        super().__init__(
            f"{result.kind} did not succeed on every member: {len(failed)} of {len(result.results)} "
            f"failed: {named or 'none named'}",
            workers={r.worker_id: r.message or r.code or r.status for r in failed},
            operation=result.model_dump(mode="json"),
        )


def _coded(base: type[ApiError], status: int, code: str) -> type[ApiError]:
    return type(f"{code.title().replace('_', '')}Error", (base,), {"status": status, "code": code})


# domain error -> (ApiError class); the most specific class is looked up first (MRO order).
TABLE: dict[type[domain.ControlPlaneError], type[ApiError]] = {
    domain.MalformedInput: BadRequestError,  # 400 bad_request
    domain.InvalidInput: ValidationFailedError,  # 422 validation_error
    domain.PathOutsideRoots: ForbiddenPathError,  # 403 path_forbidden
    domain.RouteNotAllowed: _coded(ApiError, 403, "route_forbidden"),
    domain.NotFound: NotFoundError,  # 404 not_found
    domain.Conflict: ConflictError,  # 409 conflict
    domain.StoreConflict: _coded(ConflictError, 409, "store_conflict"),
    domain.NoMembers: _coded(ApiError, 503, "no_members"),
    domain.StoreUnavailable: _coded(ApiError, 503, "store_unavailable"),
}


def to_api_error(exc: Exception) -> ApiError | None:
    if isinstance(exc, domain.NotLeader):
        return NotLeaderApiError(exc.message, leader=exc.leader)
    if isinstance(exc, domain.StaleTransferGroup):
        return MembershipChangedApiError(exc.message, **exc.change.model_dump(mode="json"))
    if isinstance(exc, domain.MissingCapability):
        return MissingCapabilityApiError(exc.message, workers=exc.workers)
    if isinstance(exc, domain.ModelNameTaken):
        return ModelNameTakenApiError(
            exc.message, field=exc.field, model=exc.model, served_by=exc.serving, fleet=exc.asking
        )
    if isinstance(exc, domain.CheckpointUnavailable):
        return CheckpointUnavailableApiError(exc.message, field=exc.field, workers=exc.workers)
    if isinstance(exc, domain.EngineRefused):
        return EngineRefusedApiError(
            exc.message, status=exc.status, workers=exc.workers, operation=exc.operation.model_dump(mode="json")
        )
    if not isinstance(exc, domain.ControlPlaneError):
        return None
    for cls in type(exc).__mro__:
        if cls in TABLE:
            return TABLE[cls](exc.message, field=exc.field)
    return None

"""The controller's HTTP errors, on the same base (and middleware) as the agent's.

    ApiError (agents.errors)
    ├── BadRequestError / ValidationFailedError 400/422, ForbiddenPathError 403,
    │   UnauthorizedError 401, NotFoundError 404, ConflictError 409   (reused as they are)
    ├── NoMembersError        503  discovery knows no worker
    ├── NotLeaderError        409  this replica does not lead; names the leader
    └── MembershipChangedError 409 the fleet changed under a broadcast group

A partial failure is not an error: it is an operation result answered with 207/502.
"""

from __future__ import annotations

from agents.errors import ApiError, ConflictError


class NoMembersError(ApiError):
    status = 503
    code = "no_members"


class NotLeaderError(ConflictError):
    code = "not_leader"


class MembershipChangedError(ConflictError):
    code = "membership_changed"

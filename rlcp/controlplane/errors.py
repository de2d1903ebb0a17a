"""The controller's domain errors: what went wrong, in the controller's own words.

Domain code (operations, the gate, paths, leadership, persistence) raises these and knows
nothing of HTTP; `rlcp.controlplane.api.errors` maps each to a status and an error code, in one
table, at the edge.

    ControlPlaneError               message, and the request field it is about (if any)
    ├── MalformedInput              a field cannot be read at all (a NUL byte in a path)
    ├── InvalidInput                a field is out of range or refused, before any worker is touched
    │   ├── InconsistentInput       well-formed but wrong for this fleet (world size, ...)
    │   └── CheckpointUnavailable   no worker can load the checkpoint (missing, unreadable, not
    │                               weights); names each worker's reason
    ├── PathOutsideRoots            a weight or adapter path outside the allowed roots
    ├── RouteNotAllowed             an engine route outside the passthrough's allowlist
    ├── EngineRefused               every member an engine route reached refused it as a client
    │                               error (4xx): the request is wrong; carries the operation
    ├── NotFound                    no such LoRA, ...
    ├── Conflict                    another operation (or session) is running
    │   ├── NotLeader               this replica does not lead; names the leader
    │   ├── StaleTransferGroup      the fleet changed under a broadcast group (409
    │   │                           membership_changed); names who joined, left or restarted
    │   ├── MissingCapability       a member cannot do what was asked; names worker and capability
    │   ├── ModelNameTaken          another fleet serves that model name; names both fleets
    │   └── StoreConflict           the desired-state store kept answering conflicts
    ├── NoMembers                   discovery knows no worker
    ├── StoreUnavailable            the desired-state store could not be reached
    └── PlacementUnavailable        placement.kind=ray without the `ray` package (a start-up error)

A partial failure is not an error: it is an operation result (207/502 at the API).
"""

from __future__ import annotations

from rlcp.core.wire.controller.operations import OperationResult
from rlcp.core.wire.controller.transfer import MembershipDelta


class ControlPlaneError(Exception):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class MalformedInput(ControlPlaneError):
    pass


class InvalidInput(ControlPlaneError):
    pass


class InconsistentInput(InvalidInput):
    pass


class CheckpointUnavailable(InvalidInput):
    def __init__(self, message: str, *, field: str, workers: dict[str, str]) -> None:
        super().__init__(message, field=field)
        self.workers = workers  # worker id -> why it cannot load the checkpoint


class PathOutsideRoots(ControlPlaneError):
    pass


class RouteNotAllowed(ControlPlaneError):
    pass


class EngineRefused(ControlPlaneError):
    """The engines' own refusal, passed back as they answered it (`status`, a 4xx): the
    operation ran (`operation`, recorded as failed) and no member took the request."""

    def __init__(self, message: str, *, status: int, workers: dict[str, str], operation: OperationResult) -> None:
        super().__init__(message)
        self.status = status
        self.workers = workers  # worker id -> what it answered
        self.operation = operation


class NotFound(ControlPlaneError):
    pass


class Conflict(ControlPlaneError):
    pass


class NotLeader(Conflict):
    def __init__(self, message: str, *, leader: str | None) -> None:
        super().__init__(message)
        self.leader = leader


class StaleTransferGroup(Conflict):
    def __init__(self, message: str, *, change: MembershipDelta) -> None:
        super().__init__(message)
        self.change = change  # who joined, left or restarted since the group's init


class MissingCapability(Conflict):
    def __init__(self, message: str, *, workers: dict[str, str]) -> None:
        super().__init__(message)
        self.workers = workers  # worker id -> the capability it lacks


class ModelNameTaken(Conflict):
    def __init__(self, message: str, *, model: str, serving: str, asking: str) -> None:
        super().__init__(message, field="name")
        self.model = model
        self.serving, self.asking = serving, asking  # the fleet that serves the name, the one refused it


class StoreConflict(Conflict):
    pass


class NoMembers(ControlPlaneError):
    pass


class StoreUnavailable(ControlPlaneError):
    pass


class PlacementUnavailable(ControlPlaneError):
    pass

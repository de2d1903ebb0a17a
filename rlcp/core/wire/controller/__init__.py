"""Wire models of the controller's native API, one module per route group (as vLLM keeps a
`protocol.py` per concern):

    updates      disk weight updates, the staleness bound               updates.py
    transfer     broadcast updates (`/v1/rl/weight_transfer/*`)         transfer.py
    pause        pause and resume                                       pause.py
    sleep        sleep, wake_up, prefix-cache reset                     sleep.py
    lora         adapters                                               lora.py
    engine       the guarded engine passthrough                         engine.py
    placement    Ray placement                                          placement.py
    operations   what every mutating route answers, the operations log  operations.py
    desired      the persisted desired state                            desired.py
    state        `GET /v1/rl/state`, member reads, the list of fleets   state.py
    models       `GET /v1/models`                                       models.py

`FleetState` is the one document a trainer reads to decide its next step and an operator reads
to see what is wrong. This root re-exports every model, for callers that read several groups.
"""

from __future__ import annotations

from rlcp.core.wire.base import EmptyRequest
from rlcp.core.wire.controller.desired import APPLIED_VERSIONS_KEPT, OPERATIONS_KEPT, DesiredState
from rlcp.core.wire.controller.engine import EngineRouteRequest
from rlcp.core.wire.controller.lora import LoraRequest, LoraSpec
from rlcp.core.wire.controller.models import ModelCard, ModelList
from rlcp.core.wire.controller.operations import (
    BubbleReport,
    CapacityPoint,
    OperationKind,
    OperationResult,
    OperationsQuery,
    OperationStatus,
    ResultStatus,
    RollProgress,
    WorkerOutage,
    WorkerResult,
)
from rlcp.core.wire.controller.pause import SELECTOR_FIELD, PauseRequest, ResumeRequest
from rlcp.core.wire.controller.placement import PlacementRequest, PlacementView
from rlcp.core.wire.controller.sleep import (
    WORKER_IDS_FIELD,
    ResetPrefixCacheRequest,
    SleepLevel,
    SleepRecord,
    SleepRequest,
    WakeTag,
    WakeUpRequest,
)
from rlcp.core.wire.controller.state import (
    AppliedState,
    EnvoyPlaneView,
    EnvoyView,
    FleetsListing,
    FleetState,
    FleetSummary,
    GatewayView,
    GatewayWorkerView,
    PauseState,
    Phase,
    SelectorQuery,
    UpdateView,
    WorkerView,
)
from rlcp.core.wire.controller.transfer import (
    MembershipDelta,
    TransferFinishRequest,
    TransferGroupView,
    TransferInitRequest,
    TransferMember,
    TransferUpdateRequest,
)
from rlcp.core.wire.controller.updates import (
    STALENESS_BOUND_MAX,
    AllAtOnce,
    BroadcastSource,
    Checkpoint,
    DiskSource,
    Rolling,
    StalenessRequest,
    UpdateStrategy,
    UpdateWeightsRequest,
)

__all__ = [
    "APPLIED_VERSIONS_KEPT",
    "AllAtOnce",
    "AppliedState",
    "BroadcastSource",
    "BubbleReport",
    "CapacityPoint",
    "Checkpoint",
    "DesiredState",
    "DiskSource",
    "EmptyRequest",
    "EngineRouteRequest",
    "EnvoyPlaneView",
    "EnvoyView",
    "FleetState",
    "FleetSummary",
    "FleetsListing",
    "GatewayView",
    "GatewayWorkerView",
    "LoraRequest",
    "LoraSpec",
    "MembershipDelta",
    "ModelCard",
    "ModelList",
    "OPERATIONS_KEPT",
    "OperationKind",
    "OperationResult",
    "OperationStatus",
    "OperationsQuery",
    "PauseRequest",
    "PauseState",
    "Phase",
    "PlacementRequest",
    "PlacementView",
    "ResetPrefixCacheRequest",
    "ResultStatus",
    "ResumeRequest",
    "RollProgress",
    "Rolling",
    "SELECTOR_FIELD",
    "STALENESS_BOUND_MAX",
    "SelectorQuery",
    "SleepLevel",
    "SleepRecord",
    "SleepRequest",
    "StalenessRequest",
    "TransferFinishRequest",
    "TransferGroupView",
    "TransferInitRequest",
    "TransferMember",
    "TransferUpdateRequest",
    "UpdateStrategy",
    "UpdateView",
    "UpdateWeightsRequest",
    "WORKER_IDS_FIELD",
    "WakeTag",
    "WakeUpRequest",
    "WorkerOutage",
    "WorkerResult",
    "WorkerView",
]

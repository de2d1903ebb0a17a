"""Wire models of the agent's admin API, one module per route group (as vLLM keeps a
`protocol.py` per concern):

    state       `GET /v1/agent/state`, operation records, probes        state.py
    control     pause, resume, sleep, wake_up, cache reset, abort     control.py
    updates     disk reloads and the version names                    updates.py
    transfer    vLLM's weight-transfer routes (broadcast)              transfer.py
    checksums   tensor checksums, the manifest rule, weight checker   checksums.py
    lora        adapter load and unload                               lora.py
    inference   the inference port's fence headers and refusals       inference.py

These are the shapes on the admin port, importable without vLLM or torch: the controller's
`agent` flavor parses agent responses with them, and the OpenAPI document is generated from
them. This root re-exports the admin port's models, for callers that read several groups; the
inference port's headers and refusals are imported from `inference` itself by what serves or
reads that port (the sim and vLLM inference servers, the gateway).
"""

from __future__ import annotations

from rlcp.core.wire.agent.checksums import (
    CHECKSUMS_DESCRIPTION,
    EMPTY_TENSOR_SHA256,
    LORA_CHECKSUM_PREFIX,
    ChecksumsAnswer,
    CompareAnswer,
    WeightCheckerRequest,
    WeightsCheckAnswer,
    WeightsCheckRequest,
    checksums_disagree,
    lora_checksum_key,
)
from rlcp.core.wire.agent.control import (
    AbortedAnswer,
    AbortRequestsRequest,
    IsPausedAnswer,
    IsSleepingAnswer,
    PauseMode,
    PauseQuery,
    ResetPrefixCacheAnswer,
    ResetPrefixCacheQuery,
    SleepAnswer,
    SleepQuery,
    WakeUpAnswer,
    WakeUpQuery,
)
from rlcp.core.wire.agent.lora import LoraLoadedAnswer, LoraLoadRequest, UnloadedAnswer
from rlcp.core.wire.agent.state import (
    AgentState,
    LoraInfo,
    MessageAnswer,
    OperationKind,
    OperationRecord,
    OperationStatus,
    ProbeAnswer,
    RequestCounts,
    StatusAnswer,
    WorldSizeAnswer,
    WorldSizeQuery,
)
from rlcp.core.wire.agent.transfer import (
    FinishWeightUpdateRequest,
    InitWeightTransferRequest,
    WeightTransferUpdateRequest,
)
from rlcp.core.wire.agent.updates import (
    DesiredVersionRequest,
    DiskUpdatedAnswer,
    DiskUpdateRequest,
    PrepareRequest,
    UpdateWeightVersionRequest,
    VersionSetAnswer,
    WeightInfoAnswer,
    WeightsUpdatedAnswer,
    WeightsUpdateRequest,
)

__all__ = [
    "AbortRequestsRequest",
    "AbortedAnswer",
    "AgentState",
    "CHECKSUMS_DESCRIPTION",
    "ChecksumsAnswer",
    "CompareAnswer",
    "DesiredVersionRequest",
    "DiskUpdateRequest",
    "DiskUpdatedAnswer",
    "EMPTY_TENSOR_SHA256",
    "FinishWeightUpdateRequest",
    "InitWeightTransferRequest",
    "IsPausedAnswer",
    "IsSleepingAnswer",
    "LORA_CHECKSUM_PREFIX",
    "LoraInfo",
    "LoraLoadRequest",
    "LoraLoadedAnswer",
    "MessageAnswer",
    "OperationKind",
    "OperationRecord",
    "OperationStatus",
    "PauseMode",
    "PauseQuery",
    "PrepareRequest",
    "ProbeAnswer",
    "RequestCounts",
    "ResetPrefixCacheAnswer",
    "ResetPrefixCacheQuery",
    "SleepAnswer",
    "SleepQuery",
    "StatusAnswer",
    "UnloadedAnswer",
    "UpdateWeightVersionRequest",
    "VersionSetAnswer",
    "WakeUpAnswer",
    "WakeUpQuery",
    "WeightCheckerRequest",
    "WeightInfoAnswer",
    "WeightTransferUpdateRequest",
    "WeightsCheckAnswer",
    "WeightsCheckRequest",
    "WeightsUpdateRequest",
    "WeightsUpdatedAnswer",
    "WorldSizeAnswer",
    "WorldSizeQuery",
    "checksums_disagree",
    "lora_checksum_key",
]

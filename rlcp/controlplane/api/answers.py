"""The controller API's own small shapes: answers of its native read routes, and the
requests and answers of the vLLM-compatible facade. The fleet-wide models (state, operation
results, requests of the native operations) are the wire contract in `rlcp.core.wire.controller`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from rlcp.controlplane.workerspec import Flavor
from rlcp.core.wire.controller import OperationResult, TransferGroupView
from rlcp.core.wire.versions import VersionName


class ListedWorker(BaseModel):
    """One entry of the listing: Dynamo's fields, then this project's."""

    model_config = ConfigDict(extra="allow")
    instance_id: str
    system_url: str = Field(description="The admin URL again, for readers that only know Dynamo's fields.")
    routes: list[str]
    world_size: int
    admin_url: str
    inference_url: str | None
    flavor: Flavor
    model: str | None
    labels: dict[str, str] = Field(default_factory=dict, description="The member's labels, from its source.")
    serving: bool
    ready: bool
    weight_version: str | None
    reachable: bool


class WorkersListing(BaseModel):
    model_config = ConfigDict(extra="allow")
    protocol_version: Literal[1]
    namespace: str
    workers: list[ListedWorker]
    membership_epoch: int


class OperationsAnswer(BaseModel):
    operations: list[OperationResult] = Field(description="Newest first, the running one included.")


class WeightTransferInfo(BaseModel):
    inference_world_size: int = Field(description="Inference ranks across the fleet.")
    trainer_world_size: int = Field(description="1 + inference_world_size: what the trainer's init info needs.")
    membership_epoch: int = Field(description="The membership these sizes are of.")
    members: list[str] = Field(
        description="The members these sizes are of, in rank order: all but those whose last status read failed "
        "(such a member is left out of the group until it answers). A trainer whose init is then refused for its "
        "world size names who joined or left meanwhile from them."
    )
    group: TransferGroupView | None


class DiskWeightsAnswer(BaseModel):
    success: Literal[True]
    message: str
    weight_version: str


class SuccessAnswer(BaseModel):
    success: Literal[True]
    message: str


# -- the facade -----------------------------------------------------------------------
class DiskWeightsRequest(BaseModel):
    """The shape RL frameworks send their inference servers for a disk update."""

    model_config = ConfigDict(extra="forbid")
    weight_dir: str = Field(min_length=1, description="Safetensors directory every worker can read.")
    weight_version: VersionName | None = Field(None, description="Defaults to the directory's name.")


class StartWeightUpdateRequest(BaseModel):
    """`POST /start_weight_update`: vLLM 0.32's route reads no body; TRL's async client sends
    `{"is_checkpoint_format": true}`, the key older vLLM releases (and vLLM's own
    `reload_weights` RPC) take."""

    model_config = ConfigDict(extra="forbid")
    is_checkpoint_format: StrictBool = Field(
        True,
        description="The chunks carry checkpoint-format tensors, loaded through the model's own weight "
        "loader: the only kind the fleet's members take (false: 422, before any worker is touched).",
    )


class FinishWeightUpdateAnswer(BaseModel):
    """vLLM's answer, and the version the weights now carry on every member."""

    message: str
    weight_version: str = Field(
        description="The version named in the request, or the one the controller minted (`broadcast-<n>`)."
    )


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=128)
    lora_int_id: int | None = None  # accepted for vLLM compatibility: the fleet knows adapters by name


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(min_length=1, max_length=128)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = True  # accepted for vLLM compatibility: a same-name load always swaps in place

"""Who the workers are and what they report: the spec discovery produces, and the status
every flavor reads into one shape. Every layer above the drivers consumes these."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from rlcp.core.labels import Labels
from rlcp.core.wire.agent import RequestCounts

# The one registration of a flavor: its name -> the driver class that holds all its facts
# (`rlcp/controlplane/workers/flavors/<flavor>.py`: what it can do, the routes it lists, how the
# gateway reaches it). Strings here, imported on first use (workers/registry.py), so this bottom
# layer names the flavors without importing any driver.
FLAVOR_DRIVERS: dict[str, str] = {
    "agent": "rlcp.controlplane.workers.flavors.agent:AgentDriver",
    "vllm": "rlcp.controlplane.workers.flavors.vllm:VllmDriver",
    "dynamo": "rlcp.controlplane.workers.flavors.dynamo:DynamoDriver",
    "sglang": "rlcp.controlplane.workers.flavors.sglang:SglangDriver",
}
FLAVORS: frozenset[str] = frozenset(FLAVOR_DRIVERS)


def known_flavor(name: str) -> str:
    if name not in FLAVOR_DRIVERS:
        raise ValueError(f"unknown worker flavor {name!r}; available: {sorted(FLAVOR_DRIVERS)}")
    return name


# A flavor's name wherever one is read (settings, discovery, the API): a registered one, said so in
# the schema as an enum.
Flavor = Annotated[
    str, AfterValidator(known_flavor), WithJsonSchema({"type": "string", "enum": sorted(FLAVOR_DRIVERS)})
]


class WorkerSpec(BaseModel):
    """One member of the fleet, as discovered. Immutable: a change is a new spec."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, description="Stable worker id (instance id, pod name, ...).")
    admin_url: str = Field(description="Base URL of the worker's admin API.")
    inference_url: str | None = Field(None, description="Base URL serving inference, if known.")
    flavor: Flavor = Field("agent", description="Which driver speaks to it.")
    world_size: int = Field(1, ge=1, description="Inference ranks behind this worker (TP x PP x DP).")
    model: str | None = None
    routes: tuple[str, ...] | None = Field(
        None,
        description="The admin routes the worker publishes (Dynamo's listing `routes`); None: not "
        "published, so the flavor's own capabilities apply.",
    )
    incarnation: str | None = Field(
        None,
        description="Which life of the worker this is, where the source knows (a Ray actor's "
        "`num_restarts`): a new value is a changed spec, so the registry starts the member "
        "afresh and the controller reads and converges it again. None: the source cannot tell.",
    )
    labels: Labels = Field(
        default_factory=Labels,
        description="Labels from the source (static config, the listing's "
        "`labels`, the pod's labels, a Ray actor's description), in Kubernetes' label syntax: "
        "what selectors match.",
    )


class WorkerStatus(BaseModel):
    """What one worker reports about itself; None where the flavor cannot tell."""

    paused: bool | None = None
    weight_version: str | None = None
    requests: RequestCounts | None = None
    loras: dict[str, str | None] = Field(default_factory=dict, description="Adapter name -> version.")
    lora_enabled: bool | None = Field(None, description="Its engine has LoRA on; None: the flavor cannot tell.")
    max_loras: int | None = Field(None, description="Adapters its engine holds at once; None: not known.")
    ready: bool | None = None
    not_ready_reason: str | None = None
    engine_alive: bool | None = None
    sleeping: bool | None = Field(
        None,
        description="The engine is asleep (vLLM's sleep mode); None: the flavor "
        "cannot tell (stock vLLM while paused: its `/is_sleeping` says true for a pause).",
    )
    world_size: int | None = None
    instance_id: str | None = Field(None, description="Changes when the worker process restarts.")
    model: str | None = Field(None, description="The base model it serves, as it names it (clients' `model`).")

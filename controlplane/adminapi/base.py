"""The AdminAPI seam: one Protocol, one implementation per worker flavor.

    AdminAPI (Protocol)
    ├── AgentAdminAPI   this project's agent (agents/admin)
    ├── VllmAdminAPI    stock `vllm serve` with VLLM_SERVER_DEV_MODE=1
    └── DynamoAdminAPI  a Dynamo worker's system port, POST /engine/<route>

Each flavor maps the controller's operations onto its worker's routes and turns
whatever the worker answers into a `WorkerStatus` or a `WorkerCallError`. The HTTP
mechanics (deadline, retries, error translation) live in `adminapi.http`.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from agents.wire import PauseMode, RequestCounts
from controlplane.workers import WorkerSpec


class WorkerStatus(BaseModel):
    """What one worker reports about itself; None where the flavor cannot tell."""

    paused: bool | None = None
    weight_version: str | None = None
    requests: RequestCounts | None = None
    loras: dict[str, str | None] = Field(default_factory=dict, description="Adapter name -> version.")
    ready: bool | None = None
    not_ready_reason: str | None = None
    engine_alive: bool | None = None
    world_size: int | None = None
    instance_id: str | None = Field(None, description="Changes when the worker process restarts.")


class AdminAPI(Protocol):
    spec: WorkerSpec

    async def status(self) -> WorkerStatus: ...

    async def pause(self, mode: PauseMode, timeout_s: float) -> None: ...

    async def resume(self) -> None: ...

    async def update_weights_from_disk(self, path: str, version: str) -> None: ...

    async def set_desired_version(self, version: str | None) -> None:
        """Tell the worker the fleet's desired version (gates its readiness); a flavor
        without such a notion does nothing."""

    async def weight_checksums(self) -> dict[str, str] | None:
        """Per-parameter checksums, or None when the flavor cannot compute them."""

    async def load_lora(self, name: str, path: str, version: str | None) -> None: ...

    async def unload_lora(self, name: str) -> None: ...

    async def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None: ...

    async def start_weight_update(self) -> None: ...

    async def update_weights(self, update_info: dict[str, Any], timeout_s: float) -> None: ...

    async def finish_weight_update(self, version: str | None) -> None: ...

    async def shutdown_weight_transfer(self) -> None: ...

    async def update_weight_version(self, version: str) -> None:
        """Name the weights the worker holds (after a finish that named none)."""

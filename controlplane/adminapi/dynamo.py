"""The `dynamo` flavor: a Dynamo worker's system port.

Dynamo exposes engine management as `POST /engine/<route>` with a JSON body, the handler
a backend registered with `runtime.register_engine_route`. Handlers report failure in the
body, not the status: HTTP 200 with `{"status": "error", "message": ...}`. That is turned
into `WorkerRejected(status=200)` here, after the HTTP layer has returned, so it is never
retried -- the worker did answer, and said no.

What Dynamo cannot tell or do, and so this flavor reports as unknown or refuses:
- pause state and request counts (no read route): None;
- loaded LoRAs: empty; world size: None (the discovery listing carries it in the spec);
- weight checksums: None, so verification is by version only;
- broadcast weight transfer: refused with 501 before anything is sent.

`mode` is passed to `pause_generation` verbatim: a vLLM-backed worker understands
abort | wait | keep; other backends have their own names.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents.wire import PauseMode
from controlplane.adminapi.base import WorkerStatus
from controlplane.adminapi.http import WorkerHTTP, WorkerRejected
from controlplane.workers import WorkerSpec

PAUSE_GRACE_S = 5.0
_NO_BROADCAST = "dynamo flavor does not support broadcast weight transfer"


class DynamoAdminAPI:
    """Speaks to one Dynamo worker's system port."""

    def __init__(self, *, spec: WorkerSpec, http: WorkerHTTP, weight_load_timeout_s: float = 600.0) -> None:
        self.spec = spec
        self.http = http
        self.weight_load_timeout_s = weight_load_timeout_s

    async def status(self) -> WorkerStatus:
        body, alive = await asyncio.gather(self._engine("get_weight_version", {}), self._engine_alive())
        return WorkerStatus(weight_version=_weight_version(body), engine_alive=alive, ready=alive)

    async def pause(self, mode: PauseMode, timeout_s: float) -> None:
        # Dynamo's pause takes no deadline; ours bounds the call. The KV cache is kept so
        # a keep-mode pause can resume without recomputing.
        await self._engine("pause_generation", {"mode": mode, "clear_cache": False},
                           timeout_s=timeout_s + PAUSE_GRACE_S)

    async def resume(self) -> None:
        await self._engine("resume_generation", {})

    async def update_weights_from_disk(self, path: str, version: str) -> None:
        await self._engine("update_weights_from_disk", {"model_path": path, "weight_version": version},
                           timeout_s=self.weight_load_timeout_s)
        # Blocks computed with the old weights must not be served after the reload.
        await self._engine("flush_cache", {})

    async def set_desired_version(self, version: str | None) -> None:
        """Dynamo has no desired-version gating; nothing to tell it."""

    async def weight_checksums(self) -> dict[str, str] | None:
        return None

    async def load_lora(self, name: str, path: str, version: str | None) -> None:
        await self._engine("load_lora", {"lora_name": name, "source": {"uri": path}},
                           timeout_s=self.weight_load_timeout_s)

    async def unload_lora(self, name: str) -> None:
        await self._engine("unload_lora", {"lora_name": name})

    async def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None:
        raise WorkerRejected(self.spec.id, _NO_BROADCAST, status=501)

    async def start_weight_update(self) -> None:
        raise WorkerRejected(self.spec.id, _NO_BROADCAST, status=501)

    async def update_weights(self, update_info: dict[str, Any], timeout_s: float) -> None:
        raise WorkerRejected(self.spec.id, _NO_BROADCAST, status=501)

    async def finish_weight_update(self, version: str | None) -> None:
        raise WorkerRejected(self.spec.id, _NO_BROADCAST, status=501)

    async def shutdown_weight_transfer(self) -> None:
        raise WorkerRejected(self.spec.id, _NO_BROADCAST, status=501)

    async def update_weight_version(self, version: str) -> None:
        raise WorkerRejected(self.spec.id, _NO_BROADCAST, status=501)

    # -- helpers ------------------------------------------------------------------------
    async def _engine(self, route: str, body: dict[str, Any], *, timeout_s: float | None = None) -> Any:
        path = f"/engine/{route}"
        answer = await self.http.request("POST", path, json_body=body, timeout_s=timeout_s)
        if isinstance(answer, dict) and answer.get("status") == "error":
            message = answer.get("message") or answer.get("error") or "no message"
            raise WorkerRejected(self.spec.id, f"POST {path} answered an error: {message}", status=200)
        return answer

    async def _engine_alive(self) -> bool | None:
        try:
            await self.http.request("GET", "/health")
        except WorkerRejected as exc:
            if exc.status == 404:
                return None  # a system port without /health: liveness unknown
            if exc.status is not None and exc.status >= 500:
                return False  # Dynamo answers 503 while the worker is not healthy
            raise
        return True


def _weight_version(body: Any) -> str | None:
    """The version from any shape Dynamo backends answer.

    Accepted, in order: `{"weight_version": v}`, `{"result": v}`, `{"data": {"weight_version": v}}`
    (any of them alongside `"status": "ok"`), or a bare string body. Backends differ, and
    the route is young; being liberal here costs nothing, since a missing version only
    means "not verified".
    """
    if isinstance(body, str):
        return body or None
    if not isinstance(body, dict):
        return None
    data = body.get("data")
    for value in (body.get("weight_version"), body.get("result"),
                  data.get("weight_version") if isinstance(data, dict) else None):
        if value is not None:
            return str(value)
    return None

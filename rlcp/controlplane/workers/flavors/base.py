"""What every driver holds (its worker's spec, the transport that reaches it, its deadlines),
and the disk update's steps composed from separate calls, for a flavor whose engine has no
staged update (stock vLLM, Dynamo)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.workers.capabilities import DESIRED_VERSION, Control, LoadReport, SleepMode, implements
from rlcp.controlplane.workers.transport import WorkerRejected, WorkerTransport
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus
from rlcp.core.wire.agent import PauseMode


class DriverBase:
    engine_prefix = ""  # where the engine's own routes sit under the admin URL (Dynamo: /engine)

    def __init__(self, *, spec: WorkerSpec, transport: WorkerTransport, deadlines: DriverDeadlines) -> None:
        self.spec = spec
        self.transport = transport
        self.deadlines = deadlines

    async def engine_call(self, method: Literal["GET", "POST"], route: str, body: Any) -> Any:
        """One engine route, as it is (`EngineRoutes`). Not retried: the controller does not know
        whether an allowlisted route is idempotent."""
        return await self.transport.request(method, f"{self.engine_prefix}/{route}", json_body=body, retry=False)


class VllmSleepRoutes(DriverBase):
    """vLLM's sleep mode over its dev routes (`vllm/entrypoints/serve/dev/sleep`), which the agent
    serves in the same shapes: `POST /sleep?level=&mode=`, `POST /wake_up?tags=`. Neither is
    retried: a sleep that timed out may still be taking hold (the status read says), and the
    operation decides what follows."""

    partial_wake = True

    async def sleep(self, level: int, mode: SleepMode, timeout_s: float) -> None:
        # The agent bounds the engine's sleep itself with `timeout_s`; stock vLLM ignores it.
        await self.transport.request("POST", "/sleep", params={"level": level, "mode": mode, "timeout_s": timeout_s},
                                     timeout_s=timeout_s + self.deadlines.grace_s, retry=False)

    async def wake_up(self, tags: list[str] | None) -> None:
        # Waking moves the weights back into accelerator memory: a load's deadline, not a control call's.
        await self.transport.request("POST", "/wake_up", params={"tags": tags} if tags else None,
                                     timeout_s=self.deadlines.weight_load_s, retry=False)


class VllmCacheRoutes(DriverBase):
    """vLLM's prefix-cache reset over its dev route (`vllm/entrypoints/serve/dev/cache`), which the
    agent serves in the same shape: `POST /reset_prefix_cache?reset_running_requests=&reset_external=`
    answering `{"success": bool}`. Idempotent, so retried."""

    async def reset_prefix_cache(self, *, running: bool, external: bool) -> None:
        params = {"reset_running_requests": str(running).lower()} | ({"reset_external": "true"} if external else {})
        body = await self.transport.request("POST", "/reset_prefix_cache", params=params)
        if isinstance(body, dict) and body.get("success") is False:
            held = "" if running else "; reset_running_requests=true preempts them"
            raise WorkerRejected(self.spec.id, "POST /reset_prefix_cache answered success=false (blocks still held "
                                 f"by running requests){held}", status=200)


class _Reloads(Control, Protocol):
    async def update_weights_from_disk(self, path: str, version: str) -> None: ...


class SeparateUpdateCalls:
    """The update transaction's steps (`DiskWeights`) as separate calls that answer nothing:
    the worker is told the desired version where it gates readiness on it, then paused; the
    load is the flavor's own reload; the resume a plain resume. The operation reads versions,
    checksums and statuses afterwards."""

    loads_with_checksums = False

    async def pause_for_update(self: _Reloads, version: str, mode: PauseMode, timeout_s: float, *,
                               weights_path: str | None = None) -> None:
        # `weights_path` is for a worker that checks the checkpoint again as it pauses: these cannot.
        if implements(self, DESIRED_VERSION):
            await self.set_desired_version(version)
        await self.pause(mode, timeout_s)

    async def load_from_disk(self: _Reloads, path: str, version: str, *, checksums: bool) -> LoadReport | None:
        # No checksums in the answer: `loads_with_checksums` is False, so they are read afterwards.
        await self.update_weights_from_disk(path, version)
        return None

    async def resume_after_update(self: _Reloads) -> WorkerStatus | None:
        # None: the operation reads statuses afterwards (a flavor may answer one here).
        await self.resume()
        return None

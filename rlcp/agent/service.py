"""The agent service: admin operations composed from engine primitives.

Sits between the admin routes (HTTP in, typed requests) and the engine (I/O). It owns
the rules every operation follows: input is checked before the engine is touched,
one mutating operation runs at a time (a second gets 409), every engine call has a
deadline, each operation leaves one record and one log line. Reads are served from
state kept here (pause state, weight version, LoRAs), never by asking an engine
that may be busy reloading weights, so they always answer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog

from rlcp.agent.checkpoint import (
    CheckpointError,
    CheckpointSummary,
    check_covers,
    inspect_checkpoint,
    read_tensor_names,
)
from rlcp.agent.engine.base import Engine, EngineError
from rlcp.agent.errors import DeadlineError, EngineCallError, EngineDeadError
from rlcp.agent.metrics import AgentMetrics
from rlcp.agent.paths import contained_files, resolve_allowed_dir
from rlcp.agent.settings import AgentSettings
from rlcp.core.errors import ApiError, ConflictError, NotFoundError, UnavailablePathError
from rlcp.core.wire.agent import (
    AgentState,
    DiskUpdateRequest,
    LoraInfo,
    LoraLoadRequest,
    OperationKind,
    OperationRecord,
    OperationStatus,
    PauseMode,
)

log = structlog.get_logger("rlcp.agent.service")
T = TypeVar("T")
_RECORDS_KEPT = 32


class AgentService:
    def __init__(self, engine: Engine, settings: AgentSettings, *, inference_url: str | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.timeouts = settings.timeouts
        self.inference_url = inference_url
        self._lock = asyncio.Lock()
        self._busy_with: OperationKind | None = None
        self._records: deque[OperationRecord] = deque(maxlen=_RECORDS_KEPT)
        self._loras: dict[str, LoraInfo] = {}
        self._next_adapter_id = 1
        self._paused = False
        self.desired_weight_version: str | None = None
        self._desired_told = False
        self.instance_id = uuid.uuid4().hex[:12]
        # Set when a weight load failed part-way: the engine's weights are then unknown.
        self._weights_broken: str | None = None
        self._chunks_since_start = 0  # transfer chunks since start_weight_update
        # The weight-transfer protocol's state as far as this agent knows it, so a call out of
        # order is a 409 before the engine sees it. None: a failed call left it unknown, and
        # the engine decides until a call succeeds again.
        self._transfer_group: bool | None = False  # joined a group: init, and no shutdown since
        self._transfer_open: bool | None = False  # between start_weight_update and finish
        self._expected_tensors: set[str] | None = None
        self.metrics = AgentMetrics()
        engine.served_version = None

    # The version these weights are reported at lives on the engine, whose inference port
    # checks requests that expect a version against it (rlcp/agent/engine/base.py).
    @property
    def _weight_version(self) -> str | None:
        return self.engine.served_version

    @_weight_version.setter
    def _weight_version(self, version: str | None) -> None:
        self.engine.served_version = version

    async def start(self) -> None:
        """Read the engine's initial state once; from here on this service tracks it."""
        model_dir = Path(self.settings.engine.model)
        if self.engine.kind == "vllm" and model_dir.is_dir() and any(model_dir.glob("*.safetensors")):
            self._expected_tensors = read_tensor_names(model_dir)
        self._paused = await self._call(self.engine.is_paused(), self.timeouts.control_s, "is_paused")
        self._weight_version = await self._call(self.engine.get_weight_version(), self.timeouts.control_s,
                                                "get_weight_version")

    # -- plumbing -------------------------------------------------------------
    async def _call(self, awaitable: Awaitable[T], deadline_s: float, what: str) -> T:
        """One engine call under a deadline, its failures mapped to the agent's errors."""
        if not self.engine.is_alive():
            if asyncio.iscoroutine(awaitable):
                awaitable.close()  # never started; closing avoids a "never awaited" warning
            raise EngineDeadError("the engine is not alive")
        try:
            async with asyncio.timeout(deadline_s):
                return await awaitable
        except TimeoutError as exc:
            raise DeadlineError(f"{what} did not finish within {deadline_s:g}s") from exc
        except EngineError as exc:
            raise EngineCallError(f"{what} failed: {exc}") from exc

    @asynccontextmanager
    async def _operation(self, kind: OperationKind, **fields: Any) -> AsyncIterator[None]:
        """Run one mutating operation: exclusive, recorded, logged once."""
        if self._lock.locked():
            raise ConflictError(f"operation {self._busy_with} is running; retry when it is done")
        async with self._lock:
            self._busy_with = kind
            op_id = uuid.uuid4().hex[:12]
            started, t0 = datetime.now(UTC), time.perf_counter()
            status: OperationStatus = "ok"
            message: str | None = None
            with structlog.contextvars.bound_contextvars(operation_id=op_id, operation=kind):
                try:
                    yield
                except DeadlineError as exc:
                    status, message = "timeout", exc.message
                    raise
                except ApiError as exc:
                    status, message = "error", exc.message
                    raise
                except Exception as exc:  # recorded, then the middleware answers 500
                    status, message = "error", f"{type(exc).__name__}: {exc}"
                    raise
                finally:
                    duration = time.perf_counter() - t0
                    self._busy_with = None
                    self._records.append(OperationRecord(id=op_id, kind=kind, status=status, started_at=started,
                                                         duration_s=round(duration, 6), message=message))
                    self.metrics.observe(kind, status, duration)
                    log.info("operation", status=status, duration_s=round(duration, 4), error=message, **fields)

    def _resolve(self, raw: str, field: str) -> Path:
        return resolve_allowed_dir(raw, self.settings.allowed_roots, field=field)

    # -- generation control ---------------------------------------------------
    async def pause(self, mode: PauseMode, timeout_s: float | None = None) -> None:
        async with self._operation("pause", mode=mode):
            try:
                await self._call(self.engine.pause(mode), timeout_s or self.timeouts.pause_s, f"pause(mode={mode})")
            except ApiError:
                # A pause that timed out may still take effect in the engine (a wait-mode
                # pause stops scheduling before it drains): report what the engine says.
                await self._refresh_paused()
                raise
            self._paused = True

    async def _refresh_paused(self) -> None:
        try:
            self._paused = await self._call(self.engine.is_paused(), self.timeouts.control_s, "is_paused")
        except ApiError:
            self._paused = True  # unknown: say paused, so nobody routes rollouts on a guess

    async def prepare(self, desired: str | None, mode: PauseMode, timeout_s: float | None = None, *,
                      weights_path: str | None = None) -> None:
        """Told the desired version, then paused: the first of an update's three calls. With
        `weights_path`, only once the checkpoint there is known loadable (`check_weights`):
        the controller checked it a moment ago, but never pausing for weights that are not
        there is this agent's rule, not only the caller's."""
        if weights_path is not None:
            await self.check_weights(weights_path, "weights_path")
        self.set_desired_version(desired)
        await self.pause(mode, timeout_s)

    async def resume(self) -> None:
        async with self._operation("resume"):
            await self._call(self.engine.resume(), self.timeouts.control_s, "resume")
            self._paused = False

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        async with self._operation("abort_requests"):
            return await self._call(self.engine.abort_requests(request_ids), self.timeouts.control_s,
                                    "abort_requests")

    # -- weights ----------------------------------------------------------------
    async def check_weights(self, raw: str, field: str = "path") -> tuple[Path, CheckpointSummary]:
        """Whether a disk load of `raw` could start now: inside the roots (the directory and
        every file in it, symlinks resolved), there, readable, and holding the model's tensors.
        Touches no engine and takes no lock: the controller asks before it pauses anyone. In a
        thread: on shared storage a stat can block for seconds, and reads must keep answering."""
        return await asyncio.to_thread(self._inspect_weights, raw, field)

    def _inspect_weights(self, raw: str, field: str) -> tuple[Path, CheckpointSummary]:
        path = self._resolve(raw, field)
        contained_files(path, self.settings.allowed_roots, field=field)
        try:
            if self._expected_tensors is not None:
                return path, check_covers(path, self._expected_tensors)
            return path, inspect_checkpoint(path)
        except CheckpointError as exc:
            raise UnavailablePathError(str(exc), field=field) from exc

    async def update_weights_from_disk(self, req: DiskUpdateRequest) -> None:
        path, _ = await self.check_weights(req.path)
        async with self._operation("update_weights_from_disk", version=req.version, path=str(path)):
            async with self._changing_weights():
                await self._call(self.engine.load_weights_from_disk(path), self.timeouts.weight_load_s,
                                 "load_weights_from_disk")
                await self._commit_version(req.version, reset_cache=req.reset_prefix_cache)

    @asynccontextmanager
    async def _changing_weights(self, *, completes: bool = True) -> AsyncIterator[None]:
        """A weight change that fails part-way leaves the engine's weights unknown: stop
        reporting a version and stay not ready until a later change succeeds."""
        try:
            yield
        except ApiError as exc:
            self._weights_broken = f"last weight change failed: {exc.message}"
            self._weight_version = None
            raise
        if completes:  # one chunk of a transfer does not make the weights whole again
            self._weights_broken = None

    async def _commit_version(self, version: str, *, reset_cache: bool = True) -> None:
        """After new weights: name them, and (vLLM's reload does not) drop KV computed with
        the old ones. Running and frozen requests are preempted too, so their next tokens
        are computed from the new weights rather than from stale KV. The new version is
        reported only once the cache is dropped: reporting it earlier makes the agent ready
        (and the controller route rollouts to it) while old KV blocks can still be served."""
        await self._call(self.engine.set_weight_version(version), self.timeouts.control_s, "set_weight_version")
        if reset_cache:
            await self._call(self.engine.reset_prefix_cache(include_running=True), self.timeouts.control_s,
                             "reset_prefix_cache")
        self._weight_version = version

    async def update_weight_version(self, version: str) -> None:
        async with self._operation("update_weight_version", version=version):
            await self._call(self.engine.set_weight_version(version), self.timeouts.control_s, "set_weight_version")
            self._weight_version = version

    async def weight_checksums(self) -> dict[str, str]:
        return await self._call(self.engine.weight_checksums(), self.timeouts.weight_load_s, "weight_checksums")

    async def reset_weight_checker(self) -> None:
        async with self._operation("weight_checker"):
            await self._call(self.engine.reset_weights(), self.timeouts.control_s, "reset_weights")

    # -- weight transfer (vLLM's protocol, passed through with deadlines) -------
    def _check_transfer_order(self, call: str) -> None:
        if call == "start_weight_update":
            if self._transfer_group is False:
                raise ConflictError("no weight-transfer group: call init_weight_transfer_engine first")
            if self._transfer_open is True:
                raise ConflictError("a weight update is already open: call finish_weight_update first")
        elif self._transfer_open is False:
            raise ConflictError(f"no weight update is open: call start_weight_update before {call}")

    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        async with self._operation("init_weight_transfer"):
            self._transfer_group = None
            await self._call(self.engine.init_weight_transfer(init_info), self.timeouts.transfer_init_s,
                             "init_weight_transfer_engine")
            self._transfer_group = True

    async def start_weight_update(self) -> None:
        self._check_transfer_order("start_weight_update")
        async with self._operation("start_weight_update"):
            self._transfer_open = None
            await self._call(self.engine.start_weight_update(), self.timeouts.transfer_chunk_s, "start_weight_update")
            self._transfer_open = True
            self._chunks_since_start = 0

    async def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._check_transfer_order("update_weights")
        async with self._operation("update_weights"), self._changing_weights(completes=False):
            self._chunks_since_start += 1  # counted before the call: a failed chunk may have landed in part
            self._transfer_open = None
            try:
                await self._call(self.engine.update_weights(update_info), self.timeouts.transfer_chunk_s,
                                 "update_weights")
            except EngineCallError:
                self._transfer_open = False  # vLLM's worker ends the update with a chunk it failed
                raise
            self._transfer_open = True

    async def finish_weight_update(self, version: str | None) -> None:
        self._check_transfer_order("finish_weight_update")
        async with self._operation("finish_weight_update", version=version), self._changing_weights():
            self._transfer_open = None
            await self._call(self.engine.finish_weight_update(), self.timeouts.transfer_chunk_s,
                             "finish_weight_update")
            self._transfer_open = False
            changed, self._chunks_since_start = self._chunks_since_start > 0, 0
            if version is not None:
                await self._commit_version(version)
                return
            if changed:
                # New weights without a name (a caller that names them later, or a session
                # ended early): the old version no longer describes them.
                self._weight_version = None
            await self._call(self.engine.reset_prefix_cache(include_running=True), self.timeouts.control_s,
                             "reset_prefix_cache")

    async def shutdown_weight_transfer(self) -> None:
        async with self._operation("shutdown_weight_transfer"):
            self._transfer_group = None
            await self._call(self.engine.shutdown_weight_transfer(), self.timeouts.control_s,
                             "shutdown_weight_transfer_engine")
            self._transfer_group = False

    # -- LoRA ---------------------------------------------------------------------
    async def check_adapter(self, raw: str, field: str = "path") -> Path:
        """As `check_weights`, for a PEFT adapter directory (its `adapter_config.json`)."""
        return await asyncio.to_thread(self._inspect_adapter, raw, field)

    def _inspect_adapter(self, raw: str, field: str) -> Path:
        path = self._resolve(raw, field)
        contained_files(path, self.settings.allowed_roots, field=field)
        if not (path / "adapter_config.json").is_file():
            raise UnavailablePathError(f"no adapter_config.json in {raw!r}", field=field)
        return path

    async def load_lora(self, req: LoraLoadRequest) -> LoraInfo:
        path = await self.check_adapter(req.path)
        async with self._operation("load_lora", lora=req.name, version=req.version):
            previous = self._loras.get(req.name)
            adapter_id = previous.adapter_id if previous else self._next_adapter_id
            await self._call(self.engine.add_lora(req.name, adapter_id, path, replace=previous is not None),
                             self.timeouts.control_s, f"add_lora({req.name})")
            if previous is None:
                self._next_adapter_id += 1
            info = LoraInfo(name=req.name, version=req.version, path=str(path), adapter_id=adapter_id,
                            loaded_at=datetime.now(UTC))
            self._loras[req.name] = info
            await self._drop_lora_cache()
            return info

    async def unload_lora(self, name: str) -> set[int]:
        """Remove the adapter from the engine and check that it is gone; returns the
        adapter ids the engine still holds."""
        info = self._loras.get(name)
        if info is None:
            raise NotFoundError(f"no LoRA named {name!r} is loaded", field="name")
        async with self._operation("unload_lora", lora=name):
            await self._call(self.engine.remove_lora(name, info.adapter_id), self.timeouts.control_s,
                             f"remove_lora({name})")
            del self._loras[name]
            await self._drop_lora_cache()
            remaining = await self._call(self.engine.list_lora_ids(), self.timeouts.control_s, "list_loras")
            if info.adapter_id in remaining:
                # A request still running with it reloads it on its next step.
                raise EngineCallError(f"adapter {name!r} (id {info.adapter_id}) is still loaded after remove "
                                      "(in use by running requests?); retry")
            return remaining

    async def _drop_lora_cache(self) -> None:
        """vLLM keys prefix-cache blocks by adapter name, so blocks computed with an adapter
        that was swapped or removed under that name would be served again. Drop them; if
        running requests hold blocks, preempt them too rather than keep stale ones."""
        ok = await self._call(self.engine.reset_prefix_cache(include_running=False), self.timeouts.control_s,
                              "reset_prefix_cache")
        if not ok:
            await self._call(self.engine.reset_prefix_cache(include_running=True), self.timeouts.control_s,
                             "reset_prefix_cache")

    # -- readiness and state --------------------------------------------------------
    def set_desired_version(self, version: str | None) -> None:
        self.desired_weight_version = version
        self._desired_told = True
        log.info("desired_version", desired=version, applied=self._weight_version)

    def not_ready_reason(self) -> str | None:
        if not self.engine.is_alive():
            return "engine is not alive"
        if self._weights_broken is not None:
            return self._weights_broken
        if self.settings.require_desired_version and not self._desired_told:
            return "waiting for the controller to tell the desired weight version"
        if self.desired_weight_version is not None and self._weight_version != self.desired_weight_version:
            return (f"applied weight version {self._weight_version!r} differs from desired "
                    f"{self.desired_weight_version!r}")
        return None

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def weight_version(self) -> str | None:
        return self._weight_version

    def state(self) -> AgentState:
        reason = self.not_ready_reason()
        return AgentState(
            agent_id=self.settings.agent_id, instance_id=self.instance_id, model=self.engine.model_name, engine=self.engine.kind,  # type: ignore[arg-type]
            engine_alive=self.engine.is_alive(), ready=reason is None, not_ready_reason=reason,
            paused=self._paused, requests=self.engine.request_counts(), weight_version=self._weight_version,
            desired_weight_version=self.desired_weight_version, loras=list(self._loras.values()),
            world_size=self.engine.world_size(), busy_with=self._busy_with,
            last_operations=list(self._records)[::-1], inference_url=self.inference_url,
        )

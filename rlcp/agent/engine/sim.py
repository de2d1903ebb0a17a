"""`SimEngine`: a simulated inference engine behind the Engine seam, for fleet-scale tests.

A real vLLM engine needs a model and seconds to start; fleet tests and benchmarks want
hundreds of engines in one process. This one keeps vLLM 0.32 AsyncLLM's observable
semantics (pause modes, request counts, weight and LoRA lifecycle, the weight-transfer
protocol) at the cost of a dict and one sleeping task per engine. It imports neither
vllm nor torch. It never stands in for vLLM in a test that claims vLLM behaviour.

Tokens are a stable hash of (weights, adapter, prompt, tokens so far) mod 1000, so the
same weights give the same tokens and any weight change shows in the output.

Behaviour copied from vLLM 0.32 on purpose (it surprises people):
- pause("wait") drains *running* requests only; requests still queued stay waiting
  until resume (vLLM's PAUSED_NEW admits no queued request). Requests added while
  paused wait; under a keep pause they are counted as frozen, as `VllmEngine` does.
- A base-weight change (disk reload or finished transfer) drops every loaded adapter
  from the engine (vLLM's `reset_lora_state`): `list_lora_ids()` is empty afterwards,
  `remove_lora` then fails, and a request naming the adapter reloads it from its path.
- `add_lora` of an id already loaded without `replace` keeps the old adapter.
- A failed `update_weights` ends the transfer session; `start_weight_update` again.
- `reset_prefix_cache(include_running=False)` is False while requests hold KV blocks.
- `sleep(level, mode)` pauses scheduling as `pause(mode)` does, then marks the weights and
  the KV cache asleep; `wake_up` resumes scheduling once both are awake again. Level 2 loses
  the weights, as it does on a GPU (the engine wakes with garbage until they are reloaded):
  the tokens and checksums change. vLLM's CPU build ignores sleep (the weights stay), so
  here the sim follows the accelerator builds, which the controller's wake must handle.
- `weight_checksums` covers the adapters the engine holds, as `VllmEngine`'s does: keys
  `lora:<name>:<tensor>` derived from the adapter's files as loaded (not its path), so
  the same bytes agree across engines and different bytes under one name do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from rlcp.agent.engine.base import EngineError, EngineKind, TransferInfo
from rlcp.agent.engine.sim_config import merged, sim_vllm_config
from rlcp.core.wire.agent import PauseMode, RequestCounts, lora_checksum_key
from rlcp.core.wire.server_info import ConfigFormat, config_text

FinishReason = Literal["length", "abort"]
_Scheduling = Literal["run", "paused_new", "paused_all"]  # vLLM's PauseState
_FAULTABLE = frozenset(
    {
        "generate",
        "pause",
        "resume",
        "is_paused",
        "abort_requests",
        "load_weights_from_disk",
        "reset_prefix_cache",
        "set_weight_version",
        "get_weight_version",
        "weight_checksums",
        "reset_weights",
        "add_lora",
        "remove_lora",
        "list_lora_ids",
        "init_weight_transfer",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "shutdown_weight_transfer",
        "sleep",
        "wake_up",
        "is_sleeping",
    }
)
_SLEEP_TAGS = frozenset({"weights", "kv_cache"})
_PARAM_NAMES = ("model.embed_tokens.weight", "model.layers.0.mlp.weight", "lm_head.weight")
_LORA_TENSORS = ("model.layers.0.self_attn.q_proj.lora_a", "model.layers.0.self_attn.q_proj.lora_b")


def _digest(*parts: bytes | str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))  # length-prefixed: ("ab","c") != ("a","bc")
        h.update(data)
    return h.digest()


def _files_digest(files: list[Path]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(files):
        h.update(_digest(f.name))
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.digest()


@dataclass
class SimOutput:
    request_id: str
    token_ids: list[int]  # all generated so far, like vLLM's CUMULATIVE output
    finished: bool = False
    finish_reason: FinishReason | None = None
    weight_versions: list[tuple[str, int, int]] = field(default_factory=list)  # (version, start, end)


@dataclass
class _Lora:
    adapter_id: int
    name: str
    key: bytes  # digest of name, path and files: what this adapter makes tokens from
    content: bytes  # digest of the files alone: what its checksums are derived from


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt_key: bytes
    max_tokens: int
    lora: _Lora | None
    chain: bytes  # digest of the tokens so far, so each step hashes O(1) bytes
    token_ids: list[int] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)  # weight version of each token
    finished: bool = False
    latest: SimOutput | None = None
    error: BaseException | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def publish(self, reason: FinishReason | None = None) -> None:
        # Outputs are cumulative, so a slow consumer may skip snapshots (as vLLM's collector merges them).
        spans: list[tuple[str, int, int]] = []
        if reason is not None:
            for i, version in enumerate(self.versions):
                if version is None:
                    continue  # vLLM reports no span for unlabelled tokens
                if spans and spans[-1][0] == version and spans[-1][2] == i:
                    spans[-1] = (version, spans[-1][1], i + 1)
                else:
                    spans.append((version, i, i + 1))
        self.latest = SimOutput(self.request_id, list(self.token_ids), reason is not None, reason, spans)
        self.ready.set()


class SimEngine:
    kind: Final[EngineKind] = "sim"

    def __init__(
        self,
        *,
        model_name: str = "sim-model",
        world_size: int = 1,
        op_latency_s: float = 0.0,
        token_interval_s: float = 0.005,
        max_running: int = 8,
        initial_weight_version: str | None = "default",
        load_latency_s: float = 0.0,
        config_overrides: dict[str, Any] | None = None,
    ) -> None:
        self._model_name = model_name
        self._world_size = world_size
        self._op_latency_s = op_latency_s
        self._load_latency_s = load_latency_s  # a disk load's own time, over every primitive's
        self._config = merged(sim_vllm_config(model_name, world_size, max_running), config_overrides or {})
        self._token_interval_s = token_interval_s
        self._max_running = max_running
        self._version = initial_weight_version
        self.served_version: str | None = None
        self._weights_key = _digest("initial", model_name)
        self._started = False
        self._dead = False
        self._task: asyncio.Task[None] | None = None
        self._faults: dict[str, tuple[Literal["fail", "hang"], str]] = {}
        self._scheduling: _Scheduling = "run"
        self._requests: dict[str, _Request] = {}  # every in-flight request
        self._running: dict[str, _Request] = {}
        self._waiting: dict[str, _Request] = {}  # FIFO by insertion order
        self._loras: dict[str, _Lora] = {}  # the serving table: name -> adapter
        self._adapters: dict[int, _Lora] = {}  # what the engine holds, by adapter id
        self._transfer_init: TransferInfo | None = None
        self._update_chunks: list[str] | None = None  # not None while a transfer is active
        self._asleep: set[str] = set()  # the allocations asleep (`_SLEEP_TAGS`)
        self._work = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self.prefix_cache_resets = 0  # these three are for tests to observe
        self.weight_update_chunks = 0
        self.updated_names: list[str] = []

    # -- test seams -------------------------------------------------------------------
    def fail_next(self, op_name: str, message: str = "injected failure") -> None:
        """The next call of the primitive `op_name` raises EngineError(message)."""
        self._inject(op_name, "fail", message)

    def hang_next(self, op_name: str) -> None:
        """The next call of `op_name` blocks until cancelled, as a stuck engine would."""
        self._inject(op_name, "hang", "")

    def _inject(self, op_name: str, kind: Literal["fail", "hang"], message: str) -> None:
        if op_name not in _FAULTABLE:  # a typo would otherwise inject nothing, silently
            raise ValueError(f"unknown primitive {op_name!r}; one of {sorted(_FAULTABLE)}")
        self._faults[op_name] = (kind, message)

    def kill(self) -> None:
        """The engine dies: in-flight requests fail and every later primitive raises."""
        self._dead = True
        if self._task is not None:
            self._task.cancel()  # awaited by shutdown()
        for req in self._requests.values():
            req.finished, req.error = True, EngineError("engine dead")
            req.ready.set()
        self._requests, self._running, self._waiting = {}, {}, {}
        self._drained.set()  # wakes a wait-mode pause, which then sees the engine dead

    def served_lora_names(self) -> list[str]:
        return list(self._loras)

    def _check_alive(self) -> None:
        if self._dead or not self._started:
            raise EngineError("engine dead" if self._dead else "engine not started")

    async def _enter(self, op: str, *, slow: bool = True) -> None:
        """Common prelude of every primitive: liveness, simulated latency, injected faults."""
        self._check_alive()
        fault = self._faults.pop(op, None)
        if fault is not None and fault[0] == "hang":
            await asyncio.get_running_loop().create_future()  # only cancellation ends this
        if slow and self._op_latency_s > 0:
            await asyncio.sleep(self._op_latency_s)
            self._check_alive()  # killed while we slept
        if fault is not None:
            raise EngineError(fault[1])

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_dir(self) -> None:
        return None  # a simulated model has a name, no checkpoint

    def is_alive(self) -> bool:
        return self._started and not self._dead

    async def start(self) -> None:
        if self._dead:
            raise EngineError("engine dead")
        if self._task is None:
            self._task = asyncio.create_task(self._schedule_forever(), name=f"sim-engine-scheduler:{id(self):x}")
        self._started = True

    async def shutdown(self) -> None:
        for req in list(self._requests.values()):
            self._finish(req, "abort")
        self._started = False
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- requests ----------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], *, max_tokens: int, request_id: str, lora_name: str | None = None
    ) -> AsyncGenerator[SimOutput, None]:
        await self._enter("generate", slow=False)
        if not prompt_token_ids or max_tokens < 1:
            raise EngineError(f"need a non-empty prompt and max_tokens >= 1, got max_tokens={max_tokens}")
        if request_id in self._requests:
            raise EngineError(f"request id {request_id!r} is already in flight")
        lora = None
        if lora_name is not None and (lora := self._loras.get(lora_name)) is None:
            raise EngineError(f"unknown LoRA adapter {lora_name!r}")
        prompt_key = _digest(json.dumps(list(prompt_token_ids)))
        req = _Request(request_id, prompt_key, max_tokens, lora, chain=prompt_key)
        self._requests[request_id] = self._waiting[request_id] = req
        self._refresh()
        try:
            while True:
                await req.ready.wait()
                req.ready.clear()
                if req.error is not None:
                    raise req.error
                assert req.latest is not None
                yield req.latest
                if req.latest.finished:
                    return
        finally:
            if not req.finished:  # the consumer went away: vLLM aborts the request
                self._finish(req, "abort")

    async def _schedule_forever(self) -> None:
        while True:
            # Sleeps while nothing can step, so hundreds of idle engines cost nothing.
            await self._work.wait()
            await asyncio.sleep(self._token_interval_s)
            self._step()

    def _step(self) -> None:
        if self._scheduling == "paused_all":
            return
        if self._scheduling == "run":
            while self._waiting and len(self._running) < self._max_running:
                rid = next(iter(self._waiting))
                self._running[rid] = self._waiting.pop(rid)
        for req in list(self._running.values()):
            # Adapters are looked up per step: a hot-swap shows in running requests, and one
            # dropped by a weight reload is loaded again from its path, as vLLM's LRU manager does.
            lora_key = b""
            if req.lora is not None:
                lora_key = self._adapters.setdefault(req.lora.adapter_id, req.lora).key
            digest = _digest(self._weights_key, lora_key, req.prompt_key, req.chain)
            token = int.from_bytes(digest[:8], "little") % 1000
            req.chain = _digest(req.chain, token.to_bytes(2, "little"))
            req.token_ids.append(token)
            req.versions.append(self._version)
            if len(req.token_ids) >= req.max_tokens:
                self._finish(req, "length")
            else:
                req.publish()
        self._refresh()

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        for table in (self._requests, self._running, self._waiting):
            table.pop(req.request_id, None)
        req.finished = True
        req.publish(reason)
        self._refresh()

    def _refresh(self) -> None:
        """Re-derive the scheduler's wake-up and the wait-mode drain from the queues."""
        steppable = self._scheduling != "paused_all" and bool(
            self._running or (self._scheduling == "run" and self._waiting)
        )
        self._work.set() if steppable else self._work.clear()
        self._drained.clear() if self._running else self._drained.set()

    # -- generation control ----------------------------------------------------------------
    async def pause(self, mode: PauseMode) -> None:
        if mode not in ("abort", "wait", "keep"):
            raise EngineError(f"invalid pause mode {mode!r}")
        await self._enter("pause")
        await self._pause_scheduling(mode)

    async def _pause_scheduling(self, mode: PauseMode) -> None:
        if mode == "abort":
            for req in list(self._requests.values()):
                self._finish(req, "abort")
        self._scheduling = "paused_all" if mode == "keep" else "paused_new"
        self._refresh()
        if mode == "wait":
            # A caller's timeout cancels only this wait; the engine stays paused, as vLLM's does.
            await self._drained.wait()
            self._check_alive()

    # -- sleep mode ------------------------------------------------------------------------
    async def sleep(self, level: int, mode: PauseMode) -> None:
        if level not in (0, 1, 2):
            raise EngineError(f"invalid sleep level {level!r}")
        await self._enter("sleep")
        await self._pause_scheduling(mode)
        if level >= 1 and not self._asleep:
            self._asleep = set(_SLEEP_TAGS)
            if level == 2:
                self._set_weights(_digest("discarded", self._weights_key))  # garbage until reloaded

    async def wake_up(self, tags: list[str] | None) -> bool:
        await self._enter("wake_up")
        self._asleep -= set(tags) if tags else _SLEEP_TAGS
        if not self._asleep:
            self._scheduling = "run"  # vLLM resumes scheduling once fully awake
            self._refresh()
        return not self._asleep

    async def is_sleeping(self) -> bool:
        await self._enter("is_sleeping", slow=False)
        return bool(self._asleep)

    async def resume(self) -> None:
        await self._enter("resume")
        self._scheduling = "run"
        self._refresh()

    async def is_paused(self) -> bool:
        await self._enter("is_paused", slow=False)
        return self.pausing

    @property
    def pausing(self) -> bool:
        """Paused, or pausing (a wait-mode pause still draining): a new request would queue."""
        return self._scheduling != "run"

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        await self._enter("abort_requests")
        # Empty or None means all, as vLLM's /abort_requests does; the count is of requests found.
        targets = (
            [self._requests[r] for r in request_ids if r in self._requests]
            if request_ids
            else list(self._requests.values())
        )
        for req in targets:
            self._finish(req, "abort")
        return len(targets)

    def request_counts(self) -> RequestCounts:
        if self._scheduling == "paused_all":
            return RequestCounts(frozen=len(self._requests))
        return RequestCounts(running=len(self._running), waiting=len(self._waiting))

    # -- weights ---------------------------------------------------------------------------
    def _set_weights(self, key: bytes) -> None:
        self._weights_key = key
        self._adapters.clear()  # vLLM's reset_lora_state after replacing base weights

    async def load_weights_from_disk(self, path: Path) -> None:
        await self._enter("load_weights_from_disk")
        path = Path(path)
        files = list(path.glob("*.safetensors")) if path.is_dir() else []
        if not files:
            raise EngineError(f"no *.safetensors files in {str(path)!r}")
        key = await asyncio.to_thread(_files_digest, files)
        if self._load_latency_s > 0:
            await asyncio.sleep(self._load_latency_s)
        self._check_alive()
        self._set_weights(_digest("disk", key))

    async def reset_prefix_cache(self, *, include_running: bool, external: bool = False) -> bool:
        await self._enter("reset_prefix_cache")
        # Running and frozen requests hold KV blocks; vLLM resets only if it may preempt them.
        # Their next tokens use the current weights anyway: each step hashes them afresh.
        if self._running and not include_running:
            return False
        self.prefix_cache_resets += 1
        return True

    async def set_weight_version(self, version: str) -> None:
        await self._enter("set_weight_version")
        self._version = version

    async def get_weight_version(self) -> str | None:
        await self._enter("get_weight_version", slow=False)
        return self._version

    async def weight_checksums(self) -> dict[str, str]:
        await self._enter("weight_checksums")
        sums = {name: _digest(self._weights_key, name).hex() for name in _PARAM_NAMES}
        for lora in self._adapters.values():
            sums |= {lora_checksum_key(lora.name, t): _digest(lora.content, t).hex() for t in _LORA_TENSORS}
        return sums

    async def reset_weights(self) -> None:
        await self._enter("reset_weights")

    def world_size(self, include_dp: bool = True) -> int:
        return self._world_size

    def server_config(self, config_format: ConfigFormat) -> dict[str, Any] | str:
        return copy.deepcopy(self._config) if config_format == "json" else config_text(self._config)

    # -- LoRA ------------------------------------------------------------------------------
    async def add_lora(self, name: str, adapter_id: int, path: Path, *, replace: bool) -> None:
        await self._enter("add_lora")
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise EngineError(f"no adapter_config.json in {str(path)!r}")
        content = await asyncio.to_thread(_files_digest, [f for f in path.iterdir() if f.is_file()])
        self._check_alive()
        lora = _Lora(adapter_id, name, _digest(name, str(path.resolve()), content), content)
        self._loras[name] = lora
        if replace or adapter_id not in self._adapters:
            self._adapters[adapter_id] = lora

    async def remove_lora(self, name: str, adapter_id: int) -> None:
        await self._enter("remove_lora")
        self._loras.pop(name, None)  # the serving table forgets it either way, as VllmEngine's does
        # Idempotent, as VllmEngine's: a weight reload may already have evicted the adapter.
        self._adapters.pop(adapter_id, None)

    async def list_lora_ids(self) -> set[int]:
        await self._enter("list_lora_ids", slow=False)
        return set(self._adapters)

    # -- weight transfer -----------------------------------------------------------------------
    async def init_weight_transfer(self, init_info: TransferInfo) -> None:
        await self._enter("init_weight_transfer")
        self._transfer_init = dict(init_info)

    async def start_weight_update(self) -> None:
        await self._enter("start_weight_update")
        if self._transfer_init is None:
            raise EngineError("weight transfer is not initialised; call init_weight_transfer first")
        if self._update_chunks is not None:
            raise EngineError("a weight update is already active; call finish_weight_update first")
        self._update_chunks, self.updated_names = [], []

    async def update_weights(self, update_info: TransferInfo | list[TransferInfo]) -> None:
        try:
            await self._enter("update_weights")
        except EngineError:
            self._update_chunks = None  # vLLM's worker ends the session when a chunk fails
            raise
        if self._update_chunks is None:
            raise EngineError("start_weight_update must be called before update_weights")
        names = [info.get("names", []) for info in (update_info if isinstance(update_info, list) else [update_info])]
        if not all(isinstance(n, list) for n in names):
            # vLLM fails such a chunk in its backend, and its worker ends the session with it.
            self._update_chunks = None
            raise EngineError(f"update_info.names must be a list of tensor names, got {names!r:.200}")
        self._update_chunks.append(json.dumps(update_info, sort_keys=True, default=repr))
        self.updated_names.extend(str(n) for chunk_names in names for n in chunk_names)
        self.weight_update_chunks += 1

    async def finish_weight_update(self) -> None:
        await self._enter("finish_weight_update")
        if self._update_chunks is None:
            raise EngineError("finish_weight_update called without a matching start_weight_update")
        chunks, self._update_chunks = self._update_chunks, None
        if chunks:
            self._set_weights(_digest("transfer", *chunks))
        else:
            self._adapters.clear()  # vLLM resets LoRA state on every finish

    async def shutdown_weight_transfer(self) -> None:
        await self._enter("shutdown_weight_transfer")
        self._transfer_init = None

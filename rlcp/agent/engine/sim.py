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

import contextlib
import copy
import json
from collections.abc import AsyncGenerator
from typing import Any, Final

from rlcp.agent.engine.base import EngineError, EngineKind
from rlcp.agent.engine.sim_config import merged, sim_vllm_config
from rlcp.agent.engine.sim_digest import digest
from rlcp.agent.engine.sim_faults import SimPrelude
from rlcp.agent.engine.sim_scheduler import SimOutput, SimRequest, SimScheduler
from rlcp.agent.engine.sim_transfer import TransferSession
from rlcp.agent.engine.sim_weight_ops import SimWeightPrimitives
from rlcp.agent.engine.sim_weights import SimWeights
from rlcp.core.wire.agent import PauseMode, RequestCounts
from rlcp.core.wire.server_info import ConfigFormat, config_text

__all__ = ["SimEngine", "SimOutput"]


class SimEngine(SimWeightPrimitives):
    """The Engine seam over collaborators of one concern each: the prelude every primitive
    passes (`sim_faults`), the scheduler (`sim_scheduler`), what the device holds
    (`sim_weights`, with its LoRA table) and the weight-transfer session (`sim_transfer`).
    Serving, generation control and sleep mode are here; the weight primitives are
    `SimWeightPrimitives`' (`sim_weight_ops`)."""

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
        self._load_latency_s = load_latency_s  # a disk load's own time, over every primitive's
        self._config = merged(sim_vllm_config(model_name, world_size, max_running), config_overrides or {})
        self.served_version: str | None = None
        self._prelude = SimPrelude(op_latency_s=op_latency_s)
        self._weights = SimWeights(model_name, initial_weight_version)
        self._loras = self._weights.loras
        self._scheduler = SimScheduler(
            max_running=max_running, token_interval_s=token_interval_s, emit=self._weights.emit
        )
        self.transfer = TransferSession()
        self.prefix_cache_resets = 0  # for tests to observe, as the transfer's counts below

    @property
    def weight_update_chunks(self) -> int:
        return self.transfer.chunk_count

    @property
    def updated_names(self) -> list[str]:
        return self.transfer.updated_names

    # -- test seams -------------------------------------------------------------------
    def fail_next(self, op_name: str, message: str = "injected failure") -> None:
        """The next call of the primitive `op_name` raises EngineError(message)."""
        self._prelude.inject(op_name, "fail", message)

    def hang_next(self, op_name: str) -> None:
        """The next call of `op_name` blocks until cancelled, as a stuck engine would."""
        self._prelude.inject(op_name, "hang", "")

    def set_token_interval(self, seconds: float) -> None:
        """How long each generated token takes from the next scheduler step on: a long one keeps
        requests in flight for as long as a test needs them there."""
        self._scheduler.set_token_interval(seconds)

    def kill(self) -> None:
        """The engine dies: in-flight requests fail and every later primitive raises."""
        self._prelude.dead = True
        self._scheduler.cancel()
        self._scheduler.fail_all(EngineError("engine dead"))

    def served_lora_names(self) -> list[str]:
        return self._loras.served_names()

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def model_dir(self) -> None:
        return None  # a simulated model has a name, no checkpoint

    def is_alive(self) -> bool:
        return self._prelude.started and not self._prelude.dead

    async def start(self) -> None:
        if self._prelude.dead:
            raise EngineError("engine dead")
        self._scheduler.start(f"sim-engine-scheduler:{id(self):x}")
        self._prelude.started = True

    async def shutdown(self) -> None:
        self._prelude.started = False
        await self._scheduler.stop()

    # -- requests ----------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], *, max_tokens: int, request_id: str, lora_name: str | None = None
    ) -> AsyncGenerator[SimOutput, None]:
        await self._enter("generate", slow=False)
        if not prompt_token_ids or max_tokens < 1:
            raise EngineError(f"need a non-empty prompt and max_tokens >= 1, got max_tokens={max_tokens}")
        if self._scheduler.in_flight(request_id):
            raise EngineError(f"request id {request_id!r} is already in flight")
        lora = None
        if lora_name is not None and (lora := self._loras.served(lora_name)) is None:
            raise EngineError(f"unknown LoRA adapter {lora_name!r}")
        prompt_key = digest(json.dumps(list(prompt_token_ids)))
        request = SimRequest(request_id, prompt_key, max_tokens, lora, prompt_key)
        # Closed with ours, so a consumer that goes away aborts the request now, not at GC.
        async with contextlib.aclosing(self._scheduler.submit(request)) as outputs:
            async for output in outputs:
                yield output

    # -- generation control ----------------------------------------------------------------
    async def pause(self, mode: PauseMode) -> None:
        if mode not in ("abort", "wait", "keep"):
            raise EngineError(f"invalid pause mode {mode!r}")
        await self._enter("pause")
        await self._pause_scheduling(mode)

    async def _pause_scheduling(self, mode: PauseMode) -> None:
        self._scheduler.pause(mode)
        if mode == "wait":
            # A caller's timeout cancels only this wait; the engine stays paused, as vLLM's does.
            await self._scheduler.drained()
            self._prelude.check_alive()

    async def sleep(self, level: int, mode: PauseMode) -> None:
        if level not in (0, 1, 2):
            raise EngineError(f"invalid sleep level {level!r}")
        await self._enter("sleep")
        await self._pause_scheduling(mode)
        self._weights.sleep(level)

    async def wake_up(self, tags: list[str] | None) -> bool:
        await self._enter("wake_up")
        if awake := self._weights.wake(tags):
            self._scheduler.resume()  # vLLM resumes scheduling once fully awake
        return awake

    async def is_sleeping(self) -> bool:
        await self._enter("is_sleeping", slow=False)
        return bool(self._weights.asleep)

    async def resume(self) -> None:
        await self._enter("resume")
        self._scheduler.resume()

    async def is_paused(self) -> bool:
        await self._enter("is_paused", slow=False)
        return self.pausing

    @property
    def pausing(self) -> bool:
        """Paused, or pausing (a wait-mode pause still draining): a new request would queue."""
        return self._scheduler.pausing

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        await self._enter("abort_requests")
        return self._scheduler.abort(request_ids)

    def request_counts(self) -> RequestCounts:
        return self._scheduler.counts()

    # -- configuration -------------------------------------------------------------------
    def world_size(self, include_dp: bool = True) -> int:
        return self._world_size

    def server_config(self, config_format: ConfigFormat) -> dict[str, Any] | str:
        return copy.deepcopy(self._config) if config_format == "json" else config_text(self._config)

"""The engine seam: what the agent needs from an inference engine, one capability at a time.

    InferenceServing    every engine: its kind and model, alive or not, started and stopped,
                        the version its inference port admits, request counts, world size,
                        its resolved configuration (vLLM's `/server_info`)
    GenerationControl   pause (abort | wait | keep), resume, is_paused, abort requests
    EnginePrefixCache   drop cached KV blocks
    VersionedWeights    name the weights, checksum them, reset the checker (an EnginePrefixCache)
    ├── EngineDiskWeights    reload every weight from a safetensors directory
    └── EngineWeightTransfer vLLM's weight-transfer protocol (init, start, chunks, finish, shutdown)
    Adapters            load / hot-swap / remove LoRA adapters (an EnginePrefixCache)
    └── SleepMode       vLLM's sleep mode: sleep (level, mode), wake_up (tags), is_sleeping

    Engine = all of them: what `VllmEngine` and `SimEngine` are.

Two implementations sit behind it: `VllmEngine` (a vLLM AsyncLLM in this process, the real
thing) and `SimEngine` (simulated, same semantics, for fleet-scale tests and benchmarks). Each
of the agent's operations (`rlcp/agent/operations/`) takes the engine as the one capability it
uses, so what an operation may ask of an engine is in its signature; a disk update is composed
there (reload + version + prefix-cache reset), so both engines share that logic and differ
only in the primitives. Which engine runs is decided in one place, `engine/factory.py`; the
rest of the agent only reports `kind`, never branches on it.

Deadlines are the agent's job (`rlcp/agent/gate.py`), not the engine's: every call here may
hang as a real engine can, and the caller wraps it in `asyncio.timeout`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from rlcp.core.wire.agent import PauseMode, RequestCounts
from rlcp.core.wire.server_info import ConfigFormat

# The engines there are. `AgentSettings.engine.kind` is one; `engine/factory.py` builds each.
EngineKind = Literal["vllm", "sim"]
# vLLM's weight-transfer `init_info` / `update_info`: JSON objects the agent passes through to
# the engine's transfer backend as they came (only the backend knows their keys).
TransferInfo = dict[str, Any]


class EngineError(Exception):
    """An engine primitive failed (the engine said no, or it is dead)."""


@runtime_checkable
class InferenceServing(Protocol):
    # The version the agent reports for these weights (None: unknown), kept by the agent
    # (`rlcp/agent/weight_state.py`); the inference port admits a request expecting a version
    # only while it is this one.
    served_version: str | None

    @property
    def kind(self) -> EngineKind: ...

    @property
    def model_name(self) -> str: ...

    def is_alive(self) -> bool: ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def request_counts(self) -> RequestCounts:
        """running / waiting now; frozen = held by a keep-mode pause."""

    def world_size(self, include_dp: bool = True) -> int: ...

    def server_config(self, config_format: ConfigFormat) -> dict[str, Any] | str:
        """The engine's resolved configuration as vLLM's `/server_info` gives it under
        `vllm_config` (`rlcp/core/wire/server_info.py`): a JSON tree, or its text form."""


@runtime_checkable
class GenerationControl(Protocol):
    async def pause(self, mode: PauseMode) -> None:
        """Stop scheduling. abort: in-flight requests end with finish_reason abort;
        wait: returns once they drained; keep: they are frozen until `resume`."""

    async def resume(self) -> None: ...

    async def is_paused(self) -> bool: ...

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        """Abort the given external ids, or every in-flight request; returns how many."""


@runtime_checkable
class EnginePrefixCache(Protocol):
    async def reset_prefix_cache(self, *, include_running: bool, external: bool = False) -> bool:
        """Drop cached KV blocks (with external, a KV connector's too); with include_running,
        running and frozen requests are preempted and recomputed on resume, so their next
        tokens use the new weights.
        False: requests hold blocks and include_running was not given, nothing dropped."""


@runtime_checkable
class VersionedWeights(EnginePrefixCache, Protocol):
    async def set_weight_version(self, version: str) -> None: ...

    async def get_weight_version(self) -> str | None: ...

    async def weight_checksums(self) -> dict[str, str]: ...

    async def reset_weights(self) -> None:
        """vLLM's weight_checker "reset": restore the checksum baseline."""


@runtime_checkable
class EngineDiskWeights(VersionedWeights, Protocol):
    @property
    def model_dir(self) -> Path | None:
        """Where the serving model's own checkpoint may be: a disk load must then cover its
        tensors (`rlcp/agent/checkpoint.py`). None: the engine has no such directory."""

    async def load_weights_from_disk(self, path: Path) -> None:
        """Reload every weight from a safetensors directory (same architecture)."""


@runtime_checkable
class EngineWeightTransfer(VersionedWeights, Protocol):
    """vLLM's weight-transfer protocol, passed through."""

    async def init_weight_transfer(self, init_info: TransferInfo) -> None: ...

    async def start_weight_update(self) -> None: ...

    async def update_weights(self, update_info: TransferInfo | list[TransferInfo]) -> None: ...

    async def finish_weight_update(self) -> None: ...

    async def shutdown_weight_transfer(self) -> None:
        """Leave the trainer's group; inference goes on."""


@runtime_checkable
class Adapters(EnginePrefixCache, Protocol):
    async def add_lora(self, name: str, adapter_id: int, path: Path, *, replace: bool) -> None:
        """Load an adapter; with replace, reload it in place under the same id."""

    async def remove_lora(self, name: str, adapter_id: int) -> None:
        """Remove the adapter from the engine itself (not just from a name table) and from
        the serving table. Idempotent: an adapter the engine no longer holds is fine."""

    async def list_lora_ids(self) -> set[int]: ...


@runtime_checkable
class SleepMode(GenerationControl, Protocol):
    """vLLM's sleep mode (`AsyncLLM.sleep` / `wake_up` / `is_sleeping`): a pause that also
    releases memory, hence a kind of generation control."""

    async def sleep(self, level: int, mode: PauseMode) -> None:
        """Pause scheduling (`mode`, as `GenerationControl.pause`), then release memory: level 1
        offloads the weights to host memory and drops the KV cache, level 2 discards both."""

    async def wake_up(self, tags: list[str] | None) -> bool:
        """Bring back every allocation (None) or the tagged ones; True once fully awake, when
        the engine also resumes scheduling (vLLM's own rule)."""

    async def is_sleeping(self) -> bool:
        """Memory released and not yet woken. (vLLM's own `is_sleeping` is also true while
        merely paused; this one is not.)"""


@runtime_checkable
class Engine(InferenceServing, SleepMode, EngineDiskWeights, EngineWeightTransfer, Adapters, Protocol):
    """Every capability: the engine the agent runs."""

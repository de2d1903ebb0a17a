"""The engine seam: what the agent needs from an inference engine.

Two implementations sit behind it: `VllmEngine` (a vLLM AsyncLLM in this process,
the real thing) and `SimEngine` (simulated, same semantics, for fleet-scale tests
and benchmarks). The agent service composes these primitives into operations
(a disk update is reload + version + prefix-cache reset), so both engines share
that logic and differ only in the primitives.

Deadlines are the service's job, not the engine's: every call here may hang as a
real engine can, and the caller wraps it in `asyncio.timeout`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlcp.core.wire.agent import PauseMode, RequestCounts


class EngineError(Exception):
    """An engine primitive failed (the engine said no, or it is dead)."""


@runtime_checkable
class Engine(Protocol):
    kind: str  # "vllm" | "sim"
    # The version the agent reports for these weights (None: unknown), kept by the service;
    # the inference port admits a request expecting a version only while it is this one.
    served_version: str | None

    @property
    def model_name(self) -> str: ...

    def is_alive(self) -> bool: ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    # -- generation control -------------------------------------------------
    async def pause(self, mode: PauseMode) -> None:
        """Stop scheduling. abort: in-flight requests end with finish_reason abort;
        wait: returns once they drained; keep: they are frozen until `resume`."""

    async def resume(self) -> None: ...

    async def is_paused(self) -> bool: ...

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        """Abort the given external ids, or every in-flight request; returns how many."""

    def request_counts(self) -> RequestCounts:
        """running / waiting now; frozen = held by a keep-mode pause."""

    # -- weights ------------------------------------------------------------
    async def load_weights_from_disk(self, path: Path) -> None:
        """Reload every weight from a safetensors directory (same architecture)."""

    async def reset_prefix_cache(self, *, include_running: bool) -> bool:
        """Drop cached KV blocks; with include_running, running and frozen requests are
        preempted and recomputed on resume, so their next tokens use the new weights."""

    async def set_weight_version(self, version: str) -> None: ...

    async def get_weight_version(self) -> str | None: ...

    async def weight_checksums(self) -> dict[str, str]: ...

    async def reset_weights(self) -> None:
        """vLLM's weight_checker "reset": restore the checksum baseline."""

    def world_size(self, include_dp: bool = True) -> int: ...

    # -- LoRA -----------------------------------------------------------------
    async def add_lora(self, name: str, adapter_id: int, path: Path, *, replace: bool) -> None:
        """Load an adapter; with replace, reload it in place under the same id."""

    async def remove_lora(self, name: str, adapter_id: int) -> None:
        """Remove the adapter from the engine itself (not just from a name table) and from
        the serving table. Idempotent: an adapter the engine no longer holds is fine."""

    async def list_lora_ids(self) -> set[int]: ...

    # -- weight transfer (vLLM's protocol, passed through) ------------------
    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None: ...

    async def start_weight_update(self) -> None: ...

    async def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None: ...

    async def finish_weight_update(self) -> None: ...

    async def shutdown_weight_transfer(self) -> None:
        """Leave the trainer's group; inference goes on."""

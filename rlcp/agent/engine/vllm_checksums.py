"""The weight checksums `VllmEngine` answers: vLLM's own, completed where vLLM 0.32 falls short.

- `compute_weight_checksums` covers the base weights only; the adapters the engine holds are
  hashed in its workers by `vllm_worker.AdapterChecksumsExtension`, installed as vLLM's
  `worker_extension_cls` (`vllm_args`), and keyed here by the names the agent loaded them under.
- On the CPU, `compute_weight_checksums` hashes empty tensors for every linear layer (their
  weights were moved into the CPU kernels); the same extension reads those weights back through
  the kernels and its digests replace the empty ones under the same keys
  (`vllm_kernel_weights`). A key still of no bytes afterwards is warned about once.
"""

from __future__ import annotations

from typing import Any

import structlog

from rlcp.agent.engine.base import EngineError
from rlcp.agent.engine.vllm_errors import engine_errors
from rlcp.agent.engine.vllm_worker import ADAPTER_CHECKSUMS_RPC, KERNEL_WEIGHT_CHECKSUMS_RPC
from rlcp.core.wire.agent import EMPTY_TENSOR_SHA256, lora_checksum_key

log = structlog.get_logger("rlcp.agent.engine.vllm")


class VllmChecksums:
    """One sha256 per tensor from an AsyncLLM's workers, and the adapter names their keys carry."""

    def __init__(self) -> None:
        self.adapter_names: dict[int, str] = {}  # adapter id -> name, kept by the engine's LoRA calls
        self._warned_empty = False

    async def compute(self, llm: Any, *, adapters: bool) -> dict[str, str]:
        merged: dict[str, str] = {}
        async with engine_errors("compute_weight_checksums"):
            for worker in await llm.compute_weight_checksums():
                if duplicates := merged.keys() & worker.keys():
                    raise EngineError(f"duplicate weight checksum keys: {sorted(duplicates)[:5]}")
                merged.update(worker)
        merged |= await self._kernel_weights(llm, merged)
        if not self._warned_empty and (empty := [k for k, v in merged.items() if v == EMPTY_TENSOR_SHA256]):
            # Parameters of no bytes that no kernel probe covered: those checksums cannot tell two
            # weight versions apart.
            self._warned_empty = True
            log.warning("weight_checksums_of_empty_tensors", empty=len(empty), tensors=len(merged), example=empty[0])
        if adapters:
            merged |= await self._adapters(llm)  # no base key starts with "lora:"
        return merged

    async def _kernel_weights(self, llm: Any, base: dict[str, str]) -> dict[str, str]:
        """The weights vLLM's CPU kernels hold, under the keys `base` gives empty digests (vllm_worker)."""
        async with engine_errors("kernel_weight_checksums"):
            per_worker = await llm.collective_rpc(KERNEL_WEIGHT_CHECKSUMS_RPC)
        probed: dict[str, str] = {}
        for worker in per_worker:
            for key, digest in worker.items():
                if base.get(key) != EMPTY_TENSOR_SHA256 or key in probed:
                    # Each probe replaces one empty parameter: anything else means our names and
                    # vLLM's no longer match, and a silent extra key would mislead verification.
                    raise EngineError(f"kernel weight {key!r} is not an empty parameter of vLLM's checksums")
                probed[key] = digest
        return probed

    async def _adapters(self, llm: Any) -> dict[str, str]:
        """`lora:<name>:<rank prefix><tensor>` for every adapter the engine holds (vllm_worker)."""
        async with engine_errors("adapter_checksums"):
            per_worker = await llm.collective_rpc(ADAPTER_CHECKSUMS_RPC)
        keyed: dict[str, str] = {}
        for worker in per_worker:
            for adapter_id, tensors in worker.items():
                # The engine may hold an adapter this agent did not name only if something else
                # loaded it; its id still keeps its keys apart (names cannot contain '#').
                name = self.adapter_names.get(int(adapter_id), f"#{adapter_id}")
                for tensor, digest in tensors.items():
                    key = lora_checksum_key(name, tensor)
                    if key in keyed:
                        raise EngineError(f"duplicate adapter checksum key {key!r}")
                    keyed[key] = digest
        return keyed

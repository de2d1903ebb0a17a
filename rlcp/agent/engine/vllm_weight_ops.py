"""`VllmEngine`'s weight primitives: the Engine seam's disk, version, checksum, LoRA and
weight-transfer capabilities (`EngineDiskWeights`, `EngineWeightTransfer`, `Adapters`), each a
call on the AsyncLLM translated to `EngineError` (`vllm_errors`).

`VllmEngine` adds its lifecycle, serving, generation control and sleep mode on top; kept
apart so each half reads as one concern, as `SimEngine`'s are. The state both halves use is
declared below. Notes from vLLM 0.32's behaviour that shape these:
- `reload_weights` (collective RPC) reloads in place but does not reset the prefix
  cache; the agent does that (`WeightState.commit`).
- vLLM's HTTP LoRA unload only drops a name from the serving table; `remove_lora`
  is what frees the adapter in the engine, and we keep the serving table in step.
- The checksums are vLLM's, completed for the adapters and the CPU kernels' weights
  (`vllm_checksums`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from rlcp.agent.engine.base import EngineError, TransferInfo
from rlcp.agent.engine.vllm_checksums import VllmChecksums
from rlcp.agent.engine.vllm_errors import engine_errors
from rlcp.agent.settings import EngineSettings


class VllmWeightPrimitives:
    # Set by VllmEngine: its settings in __init__, the AsyncLLM and vLLM's server once started.
    _settings: EngineSettings
    _llm: Any
    _inference: Any
    _checksums: VllmChecksums

    # -- weights ------------------------------------------------------------------
    async def load_weights_from_disk(self, path: Path) -> None:
        async with engine_errors("reload_weights"):
            await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})

    async def reset_prefix_cache(self, *, include_running: bool, external: bool = False) -> bool:
        async with engine_errors("reset_prefix_cache"):
            return bool(
                await self._llm.reset_prefix_cache(reset_running_requests=include_running, reset_connector=external)
            )  # the route's reset_external

    async def set_weight_version(self, version: str) -> None:
        async with engine_errors("update_weight_version"):
            await self._llm.update_weight_version(version)

    async def get_weight_version(self) -> str | None:
        async with engine_errors("get_weight_version"):
            return cast("str | None", await self._llm.get_weight_version())

    async def weight_checksums(self) -> dict[str, str]:
        return await self._checksums.compute(self._llm, adapters=self._settings.enable_lora)

    async def reset_weights(self) -> None:
        async with engine_errors("reset_weights"):
            await self._llm.collective_rpc("reset_weights")

    # -- LoRA -----------------------------------------------------------------------
    async def add_lora(self, name: str, adapter_id: int, path: Path, *, replace: bool) -> None:
        from vllm.lora.request import LoRARequest

        request = LoRARequest(lora_name=name, lora_int_id=adapter_id, lora_path=str(path), load_inplace=replace)
        async with engine_errors("add_lora"):
            if not await self._llm.add_lora(request):
                raise EngineError(f"engine refused adapter {name!r}")
        # Inference requests name the adapter as `model`; vLLM's server resolves it here.
        self._inference.state.openai_serving_models.lora_requests[name] = request
        self._checksums.adapter_names[adapter_id] = name

    async def remove_lora(self, name: str, adapter_id: int) -> None:
        self._inference.state.openai_serving_models.lora_requests.pop(name, None)
        async with engine_errors("remove_lora"):
            # False means the engine did not hold it: vLLM evicts adapters on a weight
            # reload (a request naming one reloads it lazily). Removal is idempotent.
            await self._llm.remove_lora(adapter_id)
        self._checksums.adapter_names.pop(adapter_id, None)

    async def list_lora_ids(self) -> set[int]:
        async with engine_errors("list_loras"):
            return set(await self._llm.list_loras())

    # -- weight transfer --------------------------------------------------------------
    async def init_weight_transfer(self, init_info: TransferInfo) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        async with engine_errors("init_weight_transfer_engine"):
            await self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    async def start_weight_update(self) -> None:
        async with engine_errors("start_weight_update"):
            await self._llm.start_weight_update()

    async def update_weights(self, update_info: TransferInfo | list[TransferInfo]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        async with engine_errors("update_weights"):
            await self._llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))

    async def finish_weight_update(self) -> None:
        async with engine_errors("finish_weight_update"):
            await self._llm.finish_weight_update(None)

    async def shutdown_weight_transfer(self) -> None:
        async with engine_errors("shutdown_weight_transfer_engine"):
            await self._llm.shutdown_weight_transfer_engine()

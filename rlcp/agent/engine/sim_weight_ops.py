"""`SimEngine`'s weight primitives: the Engine seam's disk, version, checksum, LoRA and
weight-transfer capabilities (`EngineDiskWeights`, `EngineWeightTransfer`, `Adapters`).

They act on what the simulated device holds (`SimWeights`, with its LoRA table) and on the
transfer session; `SimEngine` adds serving, generation control and sleep mode on top. Kept
apart so each half reads as one concern; the state both halves use is declared below.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlcp.agent.engine.base import EngineError, TransferInfo
from rlcp.agent.engine.sim_digest import digest, read_checkpoint
from rlcp.agent.engine.sim_faults import SimPrelude
from rlcp.agent.engine.sim_lora import LoraTable, read_adapter
from rlcp.agent.engine.sim_scheduler import SimScheduler
from rlcp.agent.engine.sim_transfer import TransferSession
from rlcp.agent.engine.sim_weights import SimWeights


class SimWeightPrimitives:
    # Set by SimEngine.__init__.
    _prelude: SimPrelude
    _scheduler: SimScheduler
    _weights: SimWeights
    _loras: LoraTable
    _load_latency_s: float  # a disk load's own time, over every primitive's
    transfer: TransferSession
    prefix_cache_resets: int  # for tests to observe, as the transfer's counts

    async def _enter(self, op: str, *, slow: bool = True) -> None:
        await self._prelude.enter(op, slow=slow)

    # -- weights ---------------------------------------------------------------------------
    async def load_weights_from_disk(self, path: Path) -> None:
        await self._enter("load_weights_from_disk")
        key = await read_checkpoint(Path(path))
        if self._load_latency_s > 0:
            await asyncio.sleep(self._load_latency_s)
        self._prelude.check_alive()
        self._weights.replace(digest("disk", key))

    async def reset_prefix_cache(self, *, include_running: bool, external: bool = False) -> bool:
        await self._enter("reset_prefix_cache")
        # Running and frozen requests hold KV blocks; vLLM resets only if it may preempt them.
        # Their next tokens use the current weights anyway: each step hashes them afresh.
        if self._scheduler.has_running() and not include_running:
            return False
        self.prefix_cache_resets += 1
        return True

    async def set_weight_version(self, version: str) -> None:
        await self._enter("set_weight_version")
        self._weights.version = version

    async def get_weight_version(self) -> str | None:
        await self._enter("get_weight_version", slow=False)
        return self._weights.version

    async def weight_checksums(self) -> dict[str, str]:
        await self._enter("weight_checksums")
        return self._weights.checksums()

    async def reset_weights(self) -> None:
        await self._enter("reset_weights")

    # -- LoRA ------------------------------------------------------------------------------
    async def add_lora(self, name: str, adapter_id: int, path: Path, *, replace: bool) -> None:
        await self._enter("add_lora")
        lora = await read_adapter(name, adapter_id, Path(path))
        self._prelude.check_alive()
        self._loras.add(lora, replace=replace)

    async def remove_lora(self, name: str, adapter_id: int) -> None:
        await self._enter("remove_lora")
        self._loras.remove(name, adapter_id)

    async def list_lora_ids(self) -> set[int]:
        await self._enter("list_lora_ids", slow=False)
        return self._loras.held_ids()

    # -- weight transfer -----------------------------------------------------------------------
    async def init_weight_transfer(self, init_info: TransferInfo) -> None:
        await self._enter("init_weight_transfer")
        self.transfer.init(init_info)

    async def start_weight_update(self) -> None:
        await self._enter("start_weight_update")
        self.transfer.start()

    async def update_weights(self, update_info: TransferInfo | list[TransferInfo]) -> None:
        try:
            await self._enter("update_weights")
        except EngineError:
            self.transfer.end()
            raise
        self.transfer.update(update_info)

    async def finish_weight_update(self) -> None:
        await self._enter("finish_weight_update")
        if chunks := self.transfer.finish():
            self._weights.replace(digest("transfer", *chunks))
        else:
            self._loras.drop_held()  # vLLM resets LoRA state on every finish

    async def shutdown_weight_transfer(self) -> None:
        await self._enter("shutdown_weight_transfer")
        self.transfer.shutdown()

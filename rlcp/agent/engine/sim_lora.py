"""`SimEngine`'s LoRA table: the adapters it serves by name and those it holds by id.

The two differ on purpose, as in vLLM: a base-weight change drops every held adapter
(`reset_lora_state`) while the serving table still names it, and a request naming it loads
it again from its path (vLLM's LRU manager). `add` of an id already held without `replace`
keeps the old adapter.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from rlcp.agent.engine.base import EngineError
from rlcp.agent.engine.sim_digest import digest, files_digest
from rlcp.core.wire.agent import lora_checksum_key

_LORA_TENSORS = ("model.layers.0.self_attn.q_proj.lora_a", "model.layers.0.self_attn.q_proj.lora_b")


@dataclass
class SimLora:
    adapter_id: int
    name: str
    key: bytes  # digest of name, path and files: what this adapter makes tokens from
    content: bytes  # digest of the files alone: what its checksums are derived from


class LoraTable:
    def __init__(self) -> None:
        self._served: dict[str, SimLora] = {}  # the serving table: name -> adapter
        self._held: dict[int, SimLora] = {}  # what the engine holds, by adapter id

    def add(self, lora: SimLora, *, replace: bool) -> None:
        self._served[lora.name] = lora
        if replace or lora.adapter_id not in self._held:
            self._held[lora.adapter_id] = lora

    def remove(self, name: str, adapter_id: int) -> None:
        self._served.pop(name, None)  # the serving table forgets it either way, as VllmEngine's does
        # Idempotent, as VllmEngine's: a weight reload may already have evicted the adapter.
        self._held.pop(adapter_id, None)

    def served(self, name: str) -> SimLora | None:
        return self._served.get(name)

    def served_names(self) -> list[str]:
        return list(self._served)

    def held_ids(self) -> set[int]:
        return set(self._held)

    def token_key(self, lora: SimLora) -> bytes:
        """What a request's adapter adds to its next token's hash, loading it again if dropped."""
        return self._held.setdefault(lora.adapter_id, lora).key

    def drop_held(self) -> None:
        self._held.clear()

    def checksums(self) -> dict[str, str]:
        return {
            lora_checksum_key(lora.name, t): digest(lora.content, t).hex()
            for lora in self._held.values()
            for t in _LORA_TENSORS
        }


async def read_adapter(name: str, adapter_id: int, path: Path) -> SimLora:
    """The adapter in folder `path`, its files read off the event loop."""
    if not (path / "adapter_config.json").is_file():
        raise EngineError(f"no adapter_config.json in {str(path)!r}")
    content = await asyncio.to_thread(files_digest, [f for f in path.iterdir() if f.is_file()])
    return SimLora(adapter_id, name, digest(name, str(path.resolve()), content), content)

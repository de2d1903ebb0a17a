"""LoRA adapters: load (or hot-swap in place under the same name), and unload.

The registry is this agent's table of what it loaded: a name keeps its engine id across
hot-swaps, and a new name takes the next id once its load succeeded. After a load or an
unload the prefix cache is dropped: vLLM keys cached blocks by adapter name, so blocks
computed with the adapter that was there before would be served again.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from rlcp.agent.context import AgentContext
from rlcp.agent.engine.base import Adapters
from rlcp.agent.errors import EngineCallError
from rlcp.agent.paths import allowed_dir
from rlcp.core.errors import ConflictError, NotFoundError, UnavailablePathError
from rlcp.core.wire.agent import LoraInfo, LoraLoadRequest


class LoraRegistry:
    def __init__(self) -> None:
        self._by_name: dict[str, LoraInfo] = {}
        self._next_id = 1

    def get(self, name: str) -> LoraInfo | None:
        return self._by_name.get(name)

    def adapter_id(self, name: str) -> int:
        """The id `name` holds, or, for a new name, the next free one (taken by `add`)."""
        info = self._by_name.get(name)
        return info.adapter_id if info is not None else self._next_id

    def add(self, info: LoraInfo) -> None:
        if info.name not in self._by_name:
            self._next_id += 1
        self._by_name[info.name] = info

    def remove(self, name: str) -> None:
        del self._by_name[name]

    def loaded(self) -> list[LoraInfo]:
        return list(self._by_name.values())


class Loras:
    def __init__(self, ctx: AgentContext, engine: Adapters) -> None:
        self._ctx = ctx
        self._engine = engine
        self.registry = LoraRegistry()

    async def check(self, raw: str, field: str = "path") -> Path:
        """As `DiskLoads.check`, for a PEFT adapter directory (its `adapter_config.json`)."""
        return await asyncio.to_thread(self._inspect, raw, field)

    def _inspect(self, raw: str, field: str) -> Path:
        path = allowed_dir(raw, self._ctx.settings.allowed_roots, field=field)
        if not (path / "adapter_config.json").is_file():
            raise UnavailablePathError(f"no adapter_config.json in {raw!r}", field=field)
        return path

    async def load(self, req: LoraLoadRequest) -> LoraInfo:
        self._check_capacity(req.name)
        path = await self.check(req.path)
        async with self._ctx.operation("load_lora", lora=req.name, version=req.version):
            replace = self.registry.get(req.name) is not None
            adapter_id = self.registry.adapter_id(req.name)
            await self._ctx.call(
                self._engine.add_lora(req.name, adapter_id, path, replace=replace),
                self._ctx.timeouts.control_s,
                f"add_lora({req.name})",
            )
            info = LoraInfo(
                name=req.name, version=req.version, path=str(path), adapter_id=adapter_id, loaded_at=datetime.now(UTC)
            )
            self.registry.add(info)
            await self._drop_cache()
            return info

    def _check_capacity(self, name: str) -> None:
        """A load the engine cannot hold is refused before it is tried: with LoRA off vLLM fails
        the load, and past `max_loras` it evicts the oldest adapter silently."""
        engine = self._ctx.settings.engine
        if not engine.enable_lora:
            raise ConflictError(
                "this agent's engine runs without LoRA (engine.enable_lora is off): it cannot load an adapter",
                field="name",
            )
        held = [info.name for info in self.registry.loaded()]
        if name not in held and len(held) >= engine.max_loras:
            raise ConflictError(
                f"loading {name!r} would exceed max_loras={engine.max_loras} (loaded: {', '.join(held)}); "
                "unload one first",
                field="name",
            )

    async def unload(self, name: str) -> set[int]:
        """Remove the adapter from the engine and check that it is gone; returns the
        adapter ids the engine still holds."""
        info = self.registry.get(name)
        if info is None:
            raise NotFoundError(f"no LoRA named {name!r} is loaded", field="name")
        async with self._ctx.operation("unload_lora", lora=name):
            await self._ctx.call(
                self._engine.remove_lora(name, info.adapter_id), self._ctx.timeouts.control_s, f"remove_lora({name})"
            )
            self.registry.remove(name)
            await self._drop_cache()
            remaining = await self._ctx.call(self._engine.list_lora_ids(), self._ctx.timeouts.control_s, "list_loras")
            if info.adapter_id in remaining:
                # A request still running with it reloads it on its next step.
                raise EngineCallError(
                    f"adapter {name!r} (id {info.adapter_id}) is still loaded after remove "
                    "(in use by running requests?); retry"
                )
            return remaining

    async def _drop_cache(self) -> None:
        """vLLM keys prefix-cache blocks by adapter name, so blocks computed with an adapter
        that was swapped or removed under that name would be served again. Drop them; if
        running requests hold blocks, preempt them too rather than keep stale ones."""
        ok = await self._ctx.call(
            self._engine.reset_prefix_cache(include_running=False), self._ctx.timeouts.control_s, "reset_prefix_cache"
        )
        if not ok:
            await self._ctx.call(
                self._engine.reset_prefix_cache(include_running=True),
                self._ctx.timeouts.control_s,
                "reset_prefix_cache",
            )

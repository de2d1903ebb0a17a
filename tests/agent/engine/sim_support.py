"""What the SimEngine tests share: a prompt, a request run to its end, a bounded wait, weights and
adapter directories on disk, and the engine's own tasks. The `sim` fixture: conftest.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from rlcp.agent.engine.sim import SimEngine, SimOutput

PROMPT = [1, 2, 3, 4]


async def run(
    engine: SimEngine,
    request_id: str,
    *,
    max_tokens: int = 8,
    prompt: list[int] = PROMPT,
    lora_name: str | None = None,
    seen: list[SimOutput] | None = None,
) -> SimOutput:
    """Drive one request to its end; returns the final output."""
    last = None
    async for last in engine.generate(prompt, max_tokens=max_tokens, request_id=request_id, lora_name=lora_name):
        if seen is not None:
            seen.append(last)
    assert last is not None and last.finished
    return last


async def until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


def weights_dir(root: Path, name: str, content: bytes) -> Path:
    d = root / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(content)
    return d


def adapter_dir(root: Path, name: str, content: bytes) -> Path:
    d = root / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (d / "adapter_model.safetensors").write_bytes(content)
    return d


def sim_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("sim-engine")]

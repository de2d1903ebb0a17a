"""Engines by kind: the one module that knows which engines there are.

`build_engine` makes the engine `settings.engine.kind` names and what serves its inference
port. Everything else takes an `Engine` (`engine/base.py`) and reports its `kind`, never
branches on it: a new engine is a new case here and an implementation of the capabilities.

    kind   engine                        inference port
    vllm   `VllmEngine` (vllm_engine.py)  vLLM's own OpenAI server, started by the engine
                                         (it runs on the engine's AsyncLLM)
    sim    `SimEngine` (sim.py)          `sim_inference.py`'s small app, started here

`vllm_engine` is imported only when asked for (it imports vLLM when its engine starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, assert_never

from aiohttp import web

from rlcp.agent.engine.base import Engine
from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.engine.sim_inference import build_sim_inference_app
from rlcp.agent.settings import AgentSettings, EngineSettings, InferenceSettings
from rlcp.agent.sites import start_site

if TYPE_CHECKING:
    from rlcp.agent.engine.vllm_engine import VllmEngine


class InferencePort(Protocol):
    async def start(self) -> int:
        """Serve inference for the started engine; returns the bound port."""

    async def stop(self) -> None:
        """Stop serving (a no-op when it never started); the engine stops after it."""


@dataclass(frozen=True)
class BuiltEngine:
    engine: Engine
    inference: InferencePort


def build_engine(settings: AgentSettings) -> BuiltEngine:
    kind = settings.engine.kind
    if kind == "sim":
        return _sim(settings.engine, settings.inference)
    if kind == "vllm":
        return _vllm(settings.engine, settings.inference)
    assert_never(kind)


def _sim(engine: EngineSettings, inference: InferenceSettings) -> BuiltEngine:
    sim = SimEngine(
        model_name=engine.model or "sim-model",
        world_size=engine.sim_world_size,
        op_latency_s=engine.sim_op_latency_s,
        token_interval_s=engine.sim_token_interval_s,
        load_latency_s=engine.sim_load_latency_s,
    )
    return BuiltEngine(sim, _SimInferencePort(sim, inference))


class _SimInferencePort:
    def __init__(self, engine: SimEngine, settings: InferenceSettings) -> None:
        self._engine = engine
        self._settings = settings
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        self._runner, port = await start_site(
            build_sim_inference_app(self._engine), self._settings.host, self._settings.port
        )
        return port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _vllm(engine: EngineSettings, inference: InferenceSettings) -> BuiltEngine:
    from rlcp.agent.engine.vllm_engine import VllmEngine

    vllm = VllmEngine(engine, inference)
    return BuiltEngine(vllm, _VllmInferencePort(vllm))


class _VllmInferencePort:
    """vLLM's OpenAI server runs on the engine's own AsyncLLM: the engine starts and stops it."""

    def __init__(self, engine: VllmEngine) -> None:
        self._engine = engine

    async def start(self) -> int:
        port = self._engine.inference_port
        if port is None:
            raise RuntimeError("the vLLM engine started without its inference server")
        return port

    async def stop(self) -> None:
        pass

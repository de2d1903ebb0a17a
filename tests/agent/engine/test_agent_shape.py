"""The agent's shape, held by tests: its modules by role only look down, the engine kind is a
closed type that only the factory branches on, and every engine has every capability."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import aiohttp
import pytest

from rlcp.agent.engine import base
from rlcp.agent.engine.factory import build_engine
from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.engine.vllm_engine import VllmEngine
from rlcp.agent.settings import AgentSettings, EngineSettings, InferenceSettings
from rlcp.core.wire.agent.state import AgentState

AGENT = Path(__file__).resolve().parents[3] / "rlcp" / "agent"

# Lowest first; a module may import its own layer and those below it (docs/architecture.md,
# "Inside the agent, by role").
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "settings", "metrics", "paths", "checkpoint", "sites", "engine.base", "engine.answer_fields"),
    ("engine", "weight_transfer", "gate", "records"),
    ("context",),
    ("weight_state", "readiness"),
    ("operations",),
    ("service",),
    ("admin",),
    ("runner", "__main__"),
)
# Where an engine kind may be compared: the factory builds each kind, and the settings keep
# one kind's rule (vLLM needs a model directory) so a bad file fails as bad settings.
KIND_BRANCHES_ALLOWED = {"engine/factory.py", "settings.py"}


def agent_modules() -> dict[str, Path]:
    found = {}
    for path in sorted(AGENT.rglob("*.py")):
        parts = path.relative_to(AGENT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    # A wrong root finds nothing, and every rule then holds of nothing (it did, once the tests moved).
    assert "service" in found and "engine.base" in found, f"no agent package at {AGENT}"
    return found


def layer(module: str) -> int:
    best: tuple[int, int] | None = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    assert best is not None, f"rlcp.agent.{module} belongs to no layer"
    return best[0]


def agent_imports(path: Path, known: set[str]) -> set[str]:
    """The rlcp.agent modules a file imports (named relative to rlcp.agent), anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [
                f"{node.module}.{a.name}"
                if f"{node.module}.{a.name}".removeprefix("rlcp.agent.") in known
                else node.module
                for a in node.names
            ]
        else:
            continue
        found |= {n.removeprefix("rlcp.agent.") for n in names if n.startswith("rlcp.agent.")}
    return found


def test_the_agents_modules_only_look_down() -> None:
    modules = agent_modules()
    upward = sorted(
        f"{m} (layer {layer(m)}) -> {t} (layer {layer(t)})"
        for m, path in modules.items()
        if m
        for t in agent_imports(path, set(modules))
        if layer(t) > layer(m)
    )
    assert upward == []


def test_only_the_factory_branches_on_the_engine_kind() -> None:
    kinds = set(get_args(base.EngineKind))
    offenders = []
    for path in sorted(AGENT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            compared = (
                [node.left, *node.comparators]
                if isinstance(node, ast.Compare)
                else [p.value for p in ast.walk(node) if isinstance(p, ast.MatchValue)]
                if isinstance(node, ast.Match)
                else []
            )
            if any(isinstance(c, ast.Constant) and c.value in kinds for c in compared):
                rel = path.relative_to(AGENT).as_posix()
                if rel not in KIND_BRANCHES_ALLOWED:
                    offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []


def test_the_engine_kind_is_one_closed_type() -> None:
    assert get_args(base.EngineKind) == ("vllm", "sim")
    assert get_args(AgentState.model_fields["engine"].annotation) == get_args(base.EngineKind)
    assert EngineSettings.model_fields["kind"].annotation == base.EngineKind


@pytest.mark.parametrize(
    "capability",
    [
        base.InferenceServing,
        base.GenerationControl,
        base.EnginePrefixCache,
        base.VersionedWeights,
        base.EngineDiskWeights,
        base.EngineWeightTransfer,
        base.Adapters,
        base.Engine,
    ],
)
def test_every_engine_has_every_capability(capability: type) -> None:
    # Built, not started: VllmEngine imports vLLM only when it starts.
    vllm = VllmEngine(EngineSettings(kind="vllm", model="/models/m"), InferenceSettings())
    assert isinstance(SimEngine(), capability) and isinstance(vllm, capability)
    assert (SimEngine().kind, vllm.kind) == ("sim", "vllm")
    assert (SimEngine().model_dir, vllm.model_dir) == (None, Path("/models/m"))


async def test_the_factory_builds_a_sim_engine_and_serves_its_inference_port() -> None:
    settings = AgentSettings(
        engine={"kind": "sim", "model": "m", "sim_world_size": 2}, inference={"port": 0}, admin={"token": "t"}
    )
    built = build_engine(settings)
    assert isinstance(built.engine, SimEngine) and built.engine.world_size() == 2
    await built.engine.start()
    try:
        port = await built.inference.start()
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/v1/models") as resp:
            assert resp.status == 200 and (await resp.json())["data"][0]["id"] == "m"
    finally:
        await built.inference.stop()
        await built.inference.stop()  # twice is fine, as after a start that failed
        await built.engine.shutdown()

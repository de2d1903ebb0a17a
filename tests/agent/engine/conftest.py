"""Fixtures of the engine tests: a SimEngine started and shut down around each test (`sim`), and
the session's real vLLM agent put back into a known state before and after each test (`agent`: its
base weights as version "A", resumed, no desired version), so no test assumes another ran first or
leaves it otherwise for the engine tests of other folders."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from rlcp.agent.engine.sim import SimEngine
from rlcp.harness.processes import AgentProcess
from tests.support.engines import put_back


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimEngine]:
    engine = SimEngine(token_interval_s=0.002, max_running=4)
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.fixture
async def agent(vllm_agent: AgentProcess, tiny_models, http):
    """The shared agent, resumed and on the base weights (seed 1) as version "A", before and after."""
    yield await put_back(http, vllm_agent, tiny_models["weights-1"], "A")
    await put_back(http, vllm_agent, tiny_models["weights-1"], "A")

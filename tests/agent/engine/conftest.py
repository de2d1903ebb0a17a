"""Fixtures of the engine tests: a SimEngine started and shut down around each test (`sim`), and
the session's real vLLM agent put back into a known state before each test (`agent`: its base
weights as version "A", resumed, no desired version), so no test assumes another ran first."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from rlcp.agent.engine.sim import SimEngine
from rlcp.harness.http import call
from rlcp.harness.processes import AgentProcess


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimEngine]:
    engine = SimEngine(token_interval_s=0.002, max_running=4)
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.fixture
async def agent(vllm_agent: AgentProcess, tiny_models, http):
    """The shared agent, resumed and on the base weights (seed 1) as version "A"."""
    await call(http, "POST", vllm_agent.admin_url + "/resume", headers=vllm_agent.auth)
    status, _ = await call(
        http,
        "POST",
        vllm_agent.admin_url + "/v1/agent/weights/disk",
        headers=vllm_agent.auth,
        body={"path": str(tiny_models["weights-1"]), "version": "A"},
    )
    assert status == 200
    await call(
        http, "PUT", vllm_agent.admin_url + "/v1/agent/desired", headers=vllm_agent.auth, body={"weight_version": None}
    )
    return vllm_agent

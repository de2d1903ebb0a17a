"""Fixtures the agent tests share. The real vLLM agent is the whole suite's (`vllm_agent` in
tests/conftest.py: one engine a session, whichever folder asks first)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rlcp.harness.simfleet import SimAgent


@pytest.fixture
async def sim_agent(tmp_path: Path) -> AsyncIterator[SimAgent]:
    """One agent on SimEngine, its admin port on loopback, weights allowed under `tmp_path`."""
    agent = await SimAgent("s0", [tmp_path]).start()
    yield agent
    await agent.stop()

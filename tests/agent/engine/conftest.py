"""Fixtures of the engine tests: a SimEngine started and shut down around each test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from rlcp.agent.engine.sim import SimEngine


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimEngine]:
    engine = SimEngine(token_interval_s=0.002, max_running=4)
    await engine.start()
    yield engine
    await engine.shutdown()

"""Fixtures of the flavor tests on the wire: a real client session, and aioresponses standing in
for the workers (`wire`, tests/controlplane/workers/flavors/wire.py)."""

from __future__ import annotations

import aiohttp
import pytest

from tests.controlplane.workers.flavors.wire import RecordingWire


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def wire():
    with RecordingWire() as m:
        yield m

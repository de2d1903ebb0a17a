"""The upstream client's tests (`rlcp/controlplane/gateway/upstream.py`) run on both event loops
the gateway runs on: asyncio's own and uvloop (`gateway.event_loop`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

_BOTH_LOOPS: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, object]:
    return _BOTH_LOOPS

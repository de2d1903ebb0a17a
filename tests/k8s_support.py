"""Shared pieces of the Kubernetes tests: the fake API server, a real client pointed at it,
and bounded waits (poll for evidence with a deadline; never a bare sleep as an assertion)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client

from controlplane.k8s.client import make_api_client
from controlplane.settings import KubernetesApiSettings
from tests.k8s_fake import FakeKubeApi

T = TypeVar("T")
NS = "rl"


async def wait_for(predicate: Callable[[], Any], *, timeout_s: float = 15.0, what: str = "condition") -> Any:
    """Poll `predicate` (sync or async) until truthy; generous deadlines suit a loaded 2-core box."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if isinstance(last, Awaitable):
            last = await last
        if last:
            return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last value: {last!r})")


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi(bookmark_interval_s=0.2) as api:
        yield api
        assert not api.unknown, f"the client asked for paths the fake does not serve: {api.unknown}"


async def api_client(fake: FakeKubeApi, name: str = "test") -> client.ApiClient:
    return await make_api_client(KubernetesApiSettings(api_url=fake.url, request_timeout_s=2),
                                 user_agent=f"rl-controlplane/{name}")

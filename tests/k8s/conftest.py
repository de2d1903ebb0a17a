"""Fixtures of the Kubernetes tests: the wire-level fake API server (tests/k8s/k8s_fake.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.k8s.k8s_fake import FakeKubeApi


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi(bookmark_interval_s=0.2) as api:
        yield api
        assert not api.unknown, f"the client asked for paths the fake does not serve: {api.unknown}"

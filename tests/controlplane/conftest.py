"""Fixtures of the control plane's tests beyond the suite's (tests/conftest.py): the wire-level fake
Kubernetes API server (tests/support/k8s_fake.py) that the discovery, leadership, persistence and
k8s tests drive the real client against."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.k8s_fake import FakeKubeApi


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi(bookmark_interval_s=0.2) as api:
        yield api
        assert not api.unknown, f"the client asked for paths the fake does not serve: {api.unknown}"

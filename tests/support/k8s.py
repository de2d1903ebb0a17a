"""Shared pieces of the Kubernetes tests: a real client pointed at the fake API server, and
bounded waits with deadlines generous enough for a loaded 2-core box. The `fake` fixture is in
tests/controlplane/conftest.py."""

from __future__ import annotations

import functools

from kubernetes_asyncio import client

from rlcp.controlplane.k8s.client import make_api_client
from rlcp.controlplane.settings import KubernetesApiSettings
from rlcp.harness import waiting
from tests.support.k8s_fake import FakeKubeApi

NS = "rl"
wait_for = functools.partial(waiting.wait_for, timeout_s=15.0, interval_s=0.02)


async def api_client(fake: FakeKubeApi, name: str = "test") -> client.ApiClient:
    return await make_api_client(
        KubernetesApiSettings(api_url=fake.url, request_timeout_s=2), user_agent=f"rl-controlplane/{name}"
    )

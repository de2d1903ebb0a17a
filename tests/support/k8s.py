"""Shared pieces of the Kubernetes tests: a real client pointed at the fake API server, and
bounded waits with deadlines generous enough for a loaded 2-core box. The `fake` fixture is in
tests/controlplane/conftest.py."""

from __future__ import annotations

import functools

from kubernetes_asyncio import client

from rlcp.controlplane.k8s.client import make_api_client
from rlcp.controlplane.settings.kubernetes import KubernetesApiSettings
from rlcp.harness import waiting
from tests.support.k8s_fake import FakeKubeApi

NS = "rl"
wait_for = functools.partial(waiting.wait_for, timeout_s=15.0, interval_s=0.02)


async def api_client(fake: FakeKubeApi, name: str = "test") -> client.ApiClient:
    return await make_api_client(
        KubernetesApiSettings(api_url=fake.url, request_timeout_s=2), user_agent=f"rl-controlplane/{name}"
    )


class LeaseClock:
    """The Lease electors' clock in these tests (their `clock` seam): it stands still until the
    test moves it. A leader's renew deadline and a follower's view of when the Lease expires are
    judged by it, so neither passes because the machine was slow (an event-loop stall of 4 s was
    seen on the CI machine, longer than any renew deadline a test can afford to wait out), and
    each passes exactly when the test says so. The electors' retry periods and per-call timeouts
    still run on real time: they only decide how soon an elector notices."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

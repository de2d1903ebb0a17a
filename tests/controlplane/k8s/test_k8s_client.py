"""The API connection: a kubeconfig is honoured (server and credentials), and every failure
leaves as our error tree with the call and object named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from rlcp.controlplane.k8s.client import K8sConflict, K8sGone, K8sNotFound, K8sUnavailable, call, make_api_client
from rlcp.controlplane.settings.kubernetes import KubernetesApiSettings
from tests.support.k8s import NS, api_client
from tests.support.k8s_fake import FakeKubeApi

pytestmark = pytest.mark.timeout(30)


async def test_a_kubeconfig_gives_server_and_credentials(fake: FakeKubeApi, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "other",
                "clusters": [
                    {"name": "fake", "cluster": {"server": fake.url}},
                    {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}},
                ],
                "users": [{"name": "ctl", "user": {"token": "s3cret"}}],
                "contexts": [
                    {"name": "test", "context": {"cluster": "fake", "user": "ctl"}},
                    {"name": "other", "context": {"cluster": "nowhere", "user": "ctl"}},
                ],
            }
        )
    )
    before = kubeconfig.read_text()
    api = await make_api_client(KubernetesApiSettings(kubeconfig=kubeconfig, context="test"), user_agent="t/1")
    try:
        await client.CoreV1Api(api).list_namespaced_config_map(NS, _request_timeout=2)
    finally:
        await api.close()
    [seen] = fake.requests
    assert seen.authorization == "Bearer s3cret" and seen.user_agent == "t/1"
    assert kubeconfig.read_text() == before  # never written back


async def test_failures_map_to_our_errors_naming_the_call(fake: FakeKubeApi) -> None:
    api = await api_client(fake)
    core = client.CoreV1Api(api)
    try:
        with pytest.raises(K8sNotFound, match=r"get cm rl/x: HTTP 404.*not found"):
            await call("get cm rl/x", core.read_namespaced_config_map("x", NS, _request_timeout=2), timeout_s=2)
        body = {"metadata": {"name": "x"}, "data": {}}
        await call("create", core.create_namespaced_config_map(NS, body, _request_timeout=2), timeout_s=2)
        with pytest.raises(K8sConflict) as exists:
            await call("create cm rl/x", core.create_namespaced_config_map(NS, body, _request_timeout=2), timeout_s=2)
        assert exists.value.reason == "AlreadyExists" and "already exists" in str(exists.value)
        stale = {"metadata": {"name": "x", "resourceVersion": "0"}, "data": {}}
        with pytest.raises(K8sConflict) as conflict:
            await call(
                "update cm rl/x", core.replace_namespaced_config_map("x", NS, stale, _request_timeout=2), timeout_s=2
            )
        assert conflict.value.reason == "Conflict" and "has been modified" in str(conflict.value)
        fake.refuse(lambda r: r.path.endswith("/gone"), status=410)
        with pytest.raises(K8sGone):
            await call("get", core.read_namespaced_config_map("gone", NS, _request_timeout=2), timeout_s=2)
        fake.refuse(lambda r: r.path.endswith("/hang"), mode="hang")
        with pytest.raises(K8sUnavailable, match="get cm rl/hang"):
            await call(
                "get cm rl/hang", core.read_namespaced_config_map("hang", NS, _request_timeout=0.3), timeout_s=0.3
            )
    finally:
        await api.close()
    dead = await make_api_client(KubernetesApiSettings(api_url="http://127.0.0.1:9"), user_agent="t")
    try:
        with pytest.raises(K8sUnavailable, match="list cms"):
            await call(
                "list cms", client.CoreV1Api(dead).list_namespaced_config_map(NS, _request_timeout=1), timeout_s=1
            )
    finally:
        await dead.close()

"""The Kubernetes settings under the exact names the Helm chart sets (docs/kubernetes.md)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.settings.leader_election import LeaderElectionSettings


def test_the_charts_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "RLCP_DISCOVERY__KIND": "kubernetes",
        "RLCP_DISCOVERY__KUBERNETES__LABEL_SELECTOR": "app.kubernetes.io/name=rl-agent",
        "RLCP_DISCOVERY__KUBERNETES__NAMESPACE": "rl",
        "RLCP_DISCOVERY__KUBERNETES__ADMIN_PORT_NAME": "adm",
        "RLCP_DISCOVERY__KUBERNETES__INFERENCE_PORT_NAME": "http",
        "RLCP_DISCOVERY__KUBERNETES__WORLD_SIZE_KEY": "example.com/ranks",
        "RLCP_DISCOVERY__KUBERNETES__READ_PODS": "false",
        "RLCP_LEADER_ELECTION__ENABLED": "true",
        "RLCP_LEADER_ELECTION__NAMESPACE": "rl",
        "RLCP_LEADER_ELECTION__IDENTITY": "rl-cp-0",
        "RLCP_STORE__KIND": "configmap",
        "RLCP_STORE__CONFIGMAP_NAME": "rl-state",
        "RLCP_STORE__NAMESPACE": "rl",
        "RLCP_KUBERNETES__REQUEST_TIMEOUT_S": "5",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = ControllerSettings()
    k = s.discovery.kubernetes
    assert k is not None and (
        k.label_selector,
        k.namespace,
        k.admin_port_name,
        k.inference_port_name,
        k.world_size_key,
        k.read_pods,
        k.flavor,
    ) == ("app.kubernetes.io/name=rl-agent", "rl", "adm", "http", "example.com/ranks", False, "agent")
    le = s.leader_election
    assert (le.enabled, le.lease_name, le.namespace, le.identity) == (True, "rl-controlplane", "rl", "rl-cp-0")
    assert (le.lease_duration_s, le.renew_deadline_s, le.retry_period_s) == (15, 10, 2)
    assert (s.store.kind, s.store.configmap_name, s.store.namespace) == ("configmap", "rl-state", "rl")
    assert s.kubernetes.request_timeout_s == 5 and s.kubernetes.api_url is None


def test_defaults_outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "rl-cp-7")
    s = ControllerSettings(discovery={"kind": "kubernetes", "kubernetes": {"label_selector": "a=b"}})
    assert s.leader_election.identity == "rl-cp-7" and not s.leader_election.enabled
    assert s.discovery.kubernetes is not None and s.discovery.kubernetes.namespace == "default"
    assert s.discovery.kubernetes.world_size_key == "rlcp.io/world-size"
    assert (s.store.kind, s.store.configmap_name) == ("file", "rl-controlplane-state")


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"lease_duration_s": 10, "renew_deadline_s": 10}, "renew_deadline_s must be below lease_duration_s"),
        ({"renew_deadline_s": 2, "retry_period_s": 2}, "retry_period_s must be below renew_deadline_s"),
    ],
)
def test_timings_that_would_allow_two_leaders_are_refused(kw: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        LeaderElectionSettings(**kw)


def test_kubernetes_discovery_needs_its_section() -> None:
    with pytest.raises(ValidationError, match="discovery.kubernetes"):
        ControllerSettings(discovery={"kind": "kubernetes"})
    with pytest.raises(ValidationError, match="label_selector"):
        ControllerSettings(discovery={"kind": "kubernetes", "kubernetes": {}})

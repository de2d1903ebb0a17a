"""The `kubernetes` section: how to reach the Kubernetes API (`rlcp/controlplane/k8s/`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from rlcp.core.settings import Section


class KubernetesApiSettings(Section):
    """How to reach the Kubernetes API; shared by discovery, leader election and the ConfigMap store."""

    api_url: str | None = Field(
        None,
        description="API server URL (tests, `kubectl proxy`). Unset: in-cluster "
        "config inside a pod, else the kubeconfig.",
    )
    kubeconfig: Path | None = Field(None, description="Kubeconfig file outside a cluster; default ~/.kube/config.")
    context: str | None = Field(None, description="Kubeconfig context; default the current one.")
    request_timeout_s: float = Field(10.0, gt=0, description="Deadline of one API call, in seconds.")

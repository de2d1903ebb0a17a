"""The `store` section: where each fleet's desired state is kept (`persistence/`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from rlcp.controlplane.k8s.pod import pod_namespace
from rlcp.core.settings import Section


class StoreSettings(Section):
    kind: Literal["file", "memory", "configmap"] = "file"
    path: Path = Field(Path(".rlcp-state/desired.json"), description="Desired-state file, for kind=file.")
    configmap_name: str = Field(
        "rl-controlplane-state", min_length=1, description="ConfigMap holding the desired state, for kind=configmap."
    )
    namespace: str = Field(
        default_factory=pod_namespace, description="Namespace of that ConfigMap; default the pod's own."
    )

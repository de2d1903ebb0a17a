"""Who this pod is: its namespace and its name, as Kubernetes mounts and sets them in every pod.

The settings read them for their defaults (the namespace of the Lease, the ConfigMap store and the
EndpointSlices; the Lease holder's identity) when they are built; they live here, beside the API
client, because they are facts of the cluster, not settings. Plain files and environment: nothing
here imports the Kubernetes client, so the controller runs without a cluster.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

# Where a pod finds its own namespace (the service account volume every pod mounts).
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def pod_namespace() -> str:
    """The namespace this pod runs in, or "default" outside a cluster."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def pod_identity() -> str:
    """This replica's name in a Lease: the pod name (downward API `POD_NAME`), else the hostname
    (which Kubernetes sets to the pod name too)."""
    return os.environ.get("POD_NAME") or socket.gethostname()

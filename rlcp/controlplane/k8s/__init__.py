"""The Kubernetes API client, alone: one kubernetes_asyncio ApiClient per process and its
errors mapped to ours (`client.py`). What uses it lives with its role: EndpointSlice
discovery in `discovery/kubernetes.py`, the Lease elector in `leadership/lease.py`, the
ConfigMap store in `persistence/configmap.py` (see docs/kubernetes.md).

Nothing here is imported unless a setting asks for it, so the controller runs without a
cluster.
"""

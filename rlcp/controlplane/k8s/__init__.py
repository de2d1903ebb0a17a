"""The Kubernetes API client, alone: one kubernetes_asyncio ApiClient per process and its
errors mapped to ours (`client.py`); and who this pod is (`pod.py`: its namespace and name,
read by the settings' defaults). What uses it lives with its role: EndpointSlice
discovery in `discovery/kubernetes.py`, the Lease elector in `leadership/lease.py`, the
ConfigMap store in `persistence/configmap.py` (see docs/kubernetes.md).

The client is imported only when a setting asks for it (`pod.py` reads plain files and the
environment), so the controller runs without a
cluster.
"""

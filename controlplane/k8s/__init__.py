"""The controller inside Kubernetes: EndpointSlice discovery, Lease leader election, and the
desired state in a ConfigMap (see docs/kubernetes.md).

    client.py          one kubernetes_asyncio ApiClient per process; its errors mapped to ours
    discovery.py       EndpointSlices -> member lists (list, then watch; re-list on 410)
    leadership.py      who leads, as this replica knows it; guards mutations (no Kubernetes import)
    lease.py           the elector: acquire / renew / step down on a coordination.k8s.io Lease
    configmap_store.py the DesiredStore on a ConfigMap, optimistic concurrency

Nothing here is imported unless a setting asks for it, so the controller runs without a
cluster; only `leadership.py` is used in every configuration (always-leader by default).
"""

"""The store a controller's settings ask for; the ConfigMap one is imported only when asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.persistence.base import DesiredStore
from rlcp.controlplane.persistence.file import FileStore
from rlcp.controlplane.persistence.memory import MemoryStore
from rlcp.controlplane.settings import ControllerSettings

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


def make_store(settings: ControllerSettings, *, kube_api: ApiClient | None = None,
               leadership: Leadership | None = None) -> DesiredStore:
    if settings.store.kind == "memory":
        return MemoryStore()
    if settings.store.kind == "file":
        return FileStore(settings.store.path)
    if settings.store.kind == "configmap":
        from rlcp.controlplane.persistence.configmap import ConfigMapStore

        assert kube_api is not None and leadership is not None
        return ConfigMapStore(api=kube_api, name=settings.store.configmap_name, namespace=settings.store.namespace,
                              leadership=leadership, request_timeout_s=settings.kubernetes.request_timeout_s)
    raise ValueError(f"store kind {settings.store.kind!r} is not available in this build")

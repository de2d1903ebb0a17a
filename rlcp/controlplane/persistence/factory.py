"""The store a controller's settings ask for; the ConfigMap one is imported only when asked.

Each fleet keeps its desired state apart: the default fleet where one always was (so an
upgrade finds it), a named one beside it with the name as a suffix (`desired.teacher.json`,
ConfigMap `rl-controlplane-state-teacher`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcp.controlplane.fleetnames import DEFAULT_FLEET
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.persistence.base import DesiredStore
from rlcp.controlplane.persistence.file import FileStore
from rlcp.controlplane.persistence.memory import MemoryStore
from rlcp.controlplane.settings import ControllerSettings

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


def make_store(
    settings: ControllerSettings,
    *,
    kube_api: ApiClient | None = None,
    leadership: Leadership | None = None,
    fleet: str = DEFAULT_FLEET,
) -> DesiredStore:
    own = fleet != DEFAULT_FLEET
    if settings.store.kind == "memory":
        return MemoryStore()
    if settings.store.kind == "file":
        path = settings.store.path
        return FileStore(path.with_name(f"{path.stem}.{fleet}{path.suffix}") if own else path)
    if settings.store.kind == "configmap":
        from rlcp.controlplane.persistence.configmap import ConfigMapStore

        assert kube_api is not None and leadership is not None
        name = settings.store.configmap_name + (f"-{fleet}" if own else "")
        return ConfigMapStore(
            api=kube_api,
            name=name,
            namespace=settings.store.namespace,
            leadership=leadership,
            request_timeout_s=settings.kubernetes.request_timeout_s,
        )
    raise ValueError(f"store kind {settings.store.kind!r} is not available in this build")

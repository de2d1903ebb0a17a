"""The desired state in a ConfigMap: what `FileStore` is outside a cluster, for a controller
whose pod (and disk) may be replaced at any time.

The document is one key, `desired.json`, in one named ConfigMap. Writes are optimistic: a
replace carries the resourceVersion this replica last read or wrote, so a write from anyone
else in between (an old leader that had not stopped yet, a person with kubectl) is a 409
instead of a silent overwrite. On 409 the store re-reads and writes again only if this
replica still leads -- the leader's desired state is the one that counts -- and otherwise
fails loudly; it never writes as a follower. Missing ConfigMap: created on the first save.

    StoreConflict      conflicts kept coming (another writer)          409 `store_conflict`
    StoreUnavailable   the API could not be reached or refused        503 `store_unavailable`
    NotLeader          this replica does not lead                     409 `not_leader`
"""

from __future__ import annotations

import structlog
from kubernetes_asyncio import client
from pydantic import ValidationError

from rlcp.controlplane.errors import StoreConflict, StoreUnavailable
from rlcp.controlplane.k8s.client import K8sConflict, K8sError, K8sNotFound, call
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.core.wire.controller.desired import DesiredState

log = structlog.get_logger("rlcp.controlplane.persistence.configmap")
DATA_KEY = "desired.json"
_ATTEMPTS = 3


class ConfigMapStore:
    def __init__(
        self, *, api: client.ApiClient, name: str, namespace: str, leadership: Leadership, request_timeout_s: float
    ) -> None:
        self._core = client.CoreV1Api(api)
        self.name, self.namespace = name, namespace
        self._leadership = leadership
        self._timeout_s = request_timeout_s
        self._version: str | None = None  # resourceVersion last read or written; None: not seen
        self._what = f"ConfigMap {namespace}/{name}"
        self._log = log.bind(configmap=f"{namespace}/{name}")

    async def load(self) -> DesiredState | None:
        try:
            cm = await self._read()
        except K8sNotFound:
            self._version = None
            return None
        except K8sError as exc:
            raise StoreUnavailable(f"cannot read the desired state: {exc}") from exc
        self._version = cm.metadata.resource_version
        raw = (cm.data or {}).get(DATA_KEY)
        if raw is None:
            return None
        try:
            return DesiredState.model_validate_json(raw)
        except ValidationError as exc:
            # Refuse to start over an unreadable document rather than overwrite it with defaults.
            raise ValueError(f"{self._what} key {DATA_KEY!r} is not a desired state: {exc}") from exc

    async def save(self, desired: DesiredState) -> None:
        document = desired.model_dump_json(indent=2)
        for attempt in range(1, _ATTEMPTS + 1):
            self._leadership.require()  # a follower never writes the desired state
            try:
                written = await (self._create(document) if self._version is None else self._replace(document))
            except K8sConflict as exc:
                # AlreadyExists (someone created it first) or a stale resourceVersion (someone wrote
                # since we read): re-read, and try again only while we lead.
                self._log.warning("desired_state_write_conflict", attempt=attempt, reason=str(exc))
                await self._refresh_version()
                continue
            except K8sError as exc:
                raise StoreUnavailable(f"cannot save the desired state: {exc}") from exc
            self._version = written.metadata.resource_version
            return
        raise StoreConflict(
            f"{self._what} kept changing under this controller ({_ATTEMPTS} conflicting "
            "writes); is another controller writing it?"
        )

    async def _refresh_version(self) -> None:
        try:
            self._version = (await self._read()).metadata.resource_version
        except K8sNotFound:
            self._version = None
        except K8sError as exc:
            raise StoreUnavailable(f"cannot re-read the desired state after a conflict: {exc}") from exc

    async def _read(self) -> client.V1ConfigMap:
        return await call(
            f"get {self._what}",
            self._core.read_namespaced_config_map(self.name, self.namespace, _request_timeout=self._timeout_s),
            timeout_s=self._timeout_s,
        )

    async def _create(self, document: str) -> client.V1ConfigMap:
        return await call(
            f"create {self._what}",
            self._core.create_namespaced_config_map(
                self.namespace, self._body(document, None), _request_timeout=self._timeout_s
            ),
            timeout_s=self._timeout_s,
        )

    async def _replace(self, document: str) -> client.V1ConfigMap:
        return await call(
            f"update {self._what}",
            self._core.replace_namespaced_config_map(
                self.name, self.namespace, self._body(document, self._version), _request_timeout=self._timeout_s
            ),
            timeout_s=self._timeout_s,
        )

    def _body(self, document: str, version: str | None) -> client.V1ConfigMap:
        # resourceVersion (the optimistic-concurrency guard) is left out when None, as every unset field.
        metadata = client.V1ObjectMeta(
            name=self.name,
            namespace=self.namespace,
            resource_version=version,
            labels={"app.kubernetes.io/managed-by": "rl-controlplane"},
        )
        return client.V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=metadata, data={DATA_KEY: document})

"""Kubernetes discovery: the members are the ready endpoints of EndpointSlices selected by label.

The watch is three small layers, as in kopf:

    watch()            reconnect with backoff: a failed list or watch waits, then re-lists
    _list_then_watch() list (a complete, consistent snapshot and its resourceVersion), then
                       watch from that version, resuming after every stream end; a 410
                       ("resource version too old": the server compacted its history) ends
                       it and the caller re-lists at once
    _stream()          one watch request, with the server's timeoutSeconds and a client deadline

The slices are kept by name; every event replaces or removes one, and the member list is
computed from all of them (`members_from_slices`, pure). A re-list replaces the whole map,
so a change made while no watch was open is neither lost nor duplicated. The source yields a
complete member list whenever it changed, as every `DiscoverySource` does.

A worker is one endpoint: its id is the pod name (`targetRef`), its admin and inference URLs
come from the slice's ports named by settings, and an endpoint whose `conditions.ready` is
false is not a member (a missing `ready` means ready, as Kubernetes defines it). Its world
size is read from its pod's label or annotation (one GET per pod, cached by pod uid), else
from the slice's own labels/annotations (mirrored from the Service), else 1. The same read
gives the member its labels: the pod's own (no watch on pods is needed; a pod's labels changed
after it was read show when its endpoint changes or it restarts as a new pod).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client, watch

from rlcp.controlplane.discovery.polling import backoff_s
from rlcp.controlplane.k8s.client import K8sError, K8sGone, K8sNotFound, K8sUnavailable, call, translate
from rlcp.controlplane.settings.discovery import KubernetesDiscoverySettings
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.labels import Labels

log = structlog.get_logger("rlcp.controlplane.discovery.kubernetes")

# Several slices may carry one pod (dual-stack, or moments of rebalancing): keep one address.
_ADDRESS_PREFERENCE = {"IPv4": 0, "IPv6": 1, "FQDN": 2}


@dataclass(frozen=True)
class PodRef:
    name: str
    uid: str | None


@dataclass(frozen=True)
class PodFacts:
    """What one read of a pod gives its member."""

    world_size: int | None
    labels: Labels


def _endpoint_pod(ep: client.V1Endpoint) -> PodRef | None:
    ref = ep.target_ref
    if ref is None or ref.kind != "Pod" or not ref.name:
        return None
    return PodRef(ref.name, ref.uid)


def parse_world_size(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        size = int(value.strip())
    except ValueError:
        return None
    return size if size >= 1 else None


def _meta_value(meta: client.V1ObjectMeta | None, key: str) -> str | None:
    """An annotation wins over a label: annotations are where free-form values belong."""
    if meta is None:
        return None
    return (meta.annotations or {}).get(key) or (meta.labels or {}).get(key)


def members_from_slices(
    slices: Iterable[client.V1EndpointSlice],
    settings: KubernetesDiscoverySettings,
    pod_world_sizes: Mapping[str, int],
    *,
    pod_labels: Mapping[str, Labels] | None = None,
) -> tuple[list[WorkerSpec], list[str]]:
    """The members the slices describe, sorted by id, and a list of problems (each naming the
    slice or pod and why it was skipped). `pod_world_sizes` maps pod name -> world size read
    from the pod; pods missing from it fall back to the slice's value. `pod_labels` maps pod
    name -> its labels (a member without a pod read has none)."""
    pod_labels = pod_labels or {}
    best: dict[str, tuple[tuple[int, str], WorkerSpec]] = {}
    problems: list[str] = []
    for sl in sorted(slices, key=lambda s: s.metadata.name):
        name = sl.metadata.name
        ports = {p.name: p.port for p in sl.ports or [] if p.port is not None}
        admin_port = ports.get(settings.admin_port_name)
        if admin_port is None:
            if sl.endpoints:
                problems.append(
                    f"EndpointSlice {name}: no port named {settings.admin_port_name!r} "
                    f"(ports: {sorted(str(p) for p in ports)}); its endpoints are skipped"
                )
            continue
        inference_port = ports.get(settings.inference_port_name)
        raw_size = _meta_value(sl.metadata, settings.world_size_key)
        slice_size = parse_world_size(raw_size)
        if raw_size is not None and slice_size is None:
            problems.append(
                f"EndpointSlice {name}: {settings.world_size_key}={raw_size!r} is not a positive integer; using 1"
            )
        for ep in sl.endpoints or []:
            ready = ep.conditions.ready if ep.conditions is not None else None
            if ready is False:  # None: the server does not know, which Kubernetes defines as ready
                continue
            if not ep.addresses:
                continue
            pod = _endpoint_pod(ep)
            worker_id = pod.name if pod else (ep.hostname or ep.addresses[0])
            host = ep.addresses[0]
            if sl.address_type == "IPv6":
                host = f"[{host}]"
            base = f"{settings.scheme}://{host}"
            world_size = pod_world_sizes.get(pod.name) if pod else None
            spec = WorkerSpec(
                id=worker_id,
                admin_url=f"{base}:{admin_port}",
                inference_url=f"{base}:{inference_port}" if inference_port is not None else None,
                flavor=settings.flavor,
                world_size=world_size or slice_size or 1,
                labels=pod_labels.get(pod.name, Labels()) if pod else Labels(),
            )
            rank = (_ADDRESS_PREFERENCE.get(sl.address_type, 3), name)
            if worker_id not in best or rank < best[worker_id][0]:
                best[worker_id] = (rank, spec)
    return [spec for _, (_, spec) in sorted(best.items())], problems


class EndpointSliceSource:
    name = "kubernetes"

    def __init__(
        self,
        *,
        api: client.ApiClient,
        settings: KubernetesDiscoverySettings,
        request_timeout_s: float,
        backoff_initial_s: float = 0.5,
        iterations: int | None = None,
    ) -> None:
        self._api = api
        self._discovery = client.DiscoveryV1Api(api)
        self._core = client.CoreV1Api(api)
        self._s = settings
        self._timeout_s = request_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._iterations = iterations  # test seam: stop after this many list cycles
        self._slices: dict[str, client.V1EndpointSlice] = {}
        self._pods: dict[PodRef, PodFacts | None] = {}  # by name and uid: a new pod is read anew
        self._warned: set[str] = set()
        self._events_since_list = 0
        self._log = log.bind(namespace=settings.namespace, selector=settings.label_selector)

    # -- layer 1: reconnect with backoff ----------------------------------------------------------
    async def watch(self) -> AsyncIterator[list[WorkerSpec]]:
        cycles = failures = 0
        while self._iterations is None or cycles < self._iterations:
            cycles += 1
            try:
                async with aclosing(self._list_then_watch()) as cycle:
                    async for specs in cycle:
                        failures = 0
                        yield specs
            except K8sGone as exc:
                if self._events_since_list:
                    # The normal end of a long watch (history compacted): re-list now.
                    self._log.info("endpointslice_watch_expired", reason=str(exc))
                    continue
                # Gone right after a fresh list would be a hot loop: back off like a failure.
                failures += 1
                delay = backoff_s(failures, interval_s=self._backoff_initial_s, max_backoff_s=self._s.backoff_max_s)
                self._log.warning(
                    "endpointslice_watch_failed", reason=str(exc), failures=failures, retry_in_s=round(delay, 3)
                )
                await asyncio.sleep(delay)
            except Exception as exc:  # K8sError, or a bug on odd data: discovery must not end for good
                failures += 1
                delay = backoff_s(failures, interval_s=self._backoff_initial_s, max_backoff_s=self._s.backoff_max_s)
                if isinstance(exc, K8sError):
                    self._log.warning(
                        "endpointslice_watch_failed", reason=str(exc), failures=failures, retry_in_s=round(delay, 3)
                    )
                else:
                    self._log.exception("endpointslice_watch_error", failures=failures, retry_in_s=round(delay, 3))
                await asyncio.sleep(delay)

    # -- layer 2: list, then watch from its resourceVersion ------------------------------------------
    async def _list_then_watch(self) -> AsyncGenerator[list[WorkerSpec], None]:
        listed = await call(
            f"list EndpointSlices in {self._s.namespace} ({self._s.label_selector})",
            self._discovery.list_namespaced_endpoint_slice(
                self._s.namespace, label_selector=self._s.label_selector, _request_timeout=self._timeout_s
            ),
            timeout_s=self._timeout_s,
        )
        self._slices = {sl.metadata.name: sl for sl in listed.items or []}
        self._events_since_list = 0
        version = listed.metadata.resource_version
        self._log.info("endpointslices_listed", slices=len(self._slices), resource_version=version)
        last = await self._members()
        yield last
        while True:
            async with aclosing(self._stream(version)) as stream:
                async for event_type, version, changed in stream:
                    self._events_since_list += 1
                    if not changed:
                        continue
                    self._log.debug("endpointslice_event", type=event_type, resource_version=version)
                    members = await self._members()
                    if members != last:
                        last = members
                        yield members

    # -- layer 3: one watch request -------------------------------------------------------------------
    async def _stream(self, version: str) -> AsyncGenerator[tuple[str, str, bool], None]:
        """Yield (event type, resourceVersion to resume from, whether the slice map changed)
        until the server ends the stream. 410 raises `K8sGone`; other failures `K8sError`."""
        what = f"watch EndpointSlices in {self._s.namespace} from {version}"
        # The server ends the request after timeoutSeconds; the client's total deadline (which
        # in aiohttp covers reading the body) is a little later, so a server that never ends
        # it does not hold us forever. Not an asyncio.timeout: that would span our yields and
        # cancel the consumer instead.
        deadline = aiohttp.ClientTimeout(total=self._s.watch_timeout_s + self._timeout_s, sock_connect=self._timeout_s)
        w = watch.Watch()
        try:
            # With timeout_seconds given the library neither reconnects nor swallows a 410 by
            # itself: both are ours to handle, from the version we track.
            stream = w.stream(
                self._discovery.list_namespaced_endpoint_slice,
                self._s.namespace,
                label_selector=self._s.label_selector,
                resource_version=version,
                timeout_seconds=self._s.watch_timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=deadline,
            )
            async for event in stream:
                yield self._apply(event, what)
        except TimeoutError:
            return  # the stream outlived its deadline: resume from the last version seen
        except K8sError:
            raise
        except Exception as exc:  # the library raises ApiException, aiohttp errors, ValueError, ...
            raise translate(exc, what) from exc
        finally:
            await w.close()

    def _apply(self, event: Any, what: str) -> tuple[str, str, bool]:
        if not isinstance(event, dict) or "type" not in event:
            raise K8sUnavailable(f"{what}: not a watch event: {str(event)[:200]!r}")
        kind, raw = event["type"], event.get("raw_object") or {}
        version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        if not version:
            raise K8sUnavailable(f"{what}: {kind} event without a resourceVersion")
        if kind == "BOOKMARK":
            return kind, version, False
        obj: client.V1EndpointSlice = event["object"]
        name = obj.metadata.name
        if kind in ("ADDED", "MODIFIED"):
            self._slices[name] = obj
        elif kind == "DELETED":
            self._slices.pop(name, None)
        else:
            raise K8sUnavailable(f"{what}: unexpected event type {kind!r}")
        return kind, version, True

    # -- members ----------------------------------------------------------------------------------
    async def _members(self) -> list[WorkerSpec]:
        pods = await self._read_pods() if self._s.read_pods else {}
        members, problems = members_from_slices(
            self._slices.values(),
            self._s,
            {n: f.world_size for n, f in pods.items() if f.world_size is not None},
            pod_labels={n: f.labels for n, f in pods.items()},
        )
        for problem in problems:
            if problem not in self._warned:  # once per problem, not once per event
                self._warned.add(problem)
                self._log.warning("endpointslice_entry_skipped", reason=problem)
        return members

    async def _read_pods(self) -> dict[str, PodFacts]:
        """World sizes and labels of the ready endpoints' pods: one GET per pod it has not read,
        bounded in concurrency. A failed read is logged and retried at the next change; meanwhile
        the slice's world size counts (and an agent's own report of its world size overrides
        both), and the member has no labels."""
        wanted = {
            pod
            for sl in self._slices.values()
            if any(p.name == self._s.admin_port_name for p in sl.ports or [])
            for ep in sl.endpoints or []
            if (pod := _endpoint_pod(ep)) is not None
            and not (ep.conditions is not None and ep.conditions.ready is False)
        }
        missing = [p for p in wanted if p not in self._pods]
        if missing:
            limit = asyncio.Semaphore(16)

            async def read(pod: PodRef) -> None:
                async with limit:
                    self._pods[pod] = await self._read_pod(pod)

            results = await asyncio.gather(*(read(p) for p in missing), return_exceptions=True)
            for pod, result in zip(missing, results):
                if isinstance(result, K8sError):
                    self._log.warning("pod_read_failed", pod=pod.name, reason=str(result))
                elif isinstance(result, BaseException):
                    raise result
        # Forget pods that left, so the cache does not grow with every restart.
        self._pods = {p: f for p, f in self._pods.items() if p in wanted}
        return {p.name: f for p, f in self._pods.items() if f is not None}

    async def _read_pod(self, pod: PodRef) -> PodFacts | None:
        try:
            obj = await call(
                f"get pod {self._s.namespace}/{pod.name}",
                self._core.read_namespaced_pod(pod.name, self._s.namespace, _request_timeout=self._timeout_s),
                timeout_s=self._timeout_s,
            )
        except K8sNotFound:
            return None  # gone already; its endpoint will go too
        raw = _meta_value(obj.metadata, self._s.world_size_key)
        size = parse_world_size(raw)
        if raw is not None and size is None:
            self._log.warning("pod_world_size_invalid", pod=pod.name, key=self._s.world_size_key, value=raw)
        try:
            labels = Labels((obj.metadata.labels if obj.metadata else None) or {})
        except ValueError as exc:  # the API server checks the same syntax; only the count can be over
            self._log.warning("pod_labels_ignored", pod=pod.name, reason=str(exc))
            labels = Labels()
        return PodFacts(size, labels)

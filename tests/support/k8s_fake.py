"""A wire-level fake Kubernetes API server, for tests without a cluster.

No kube-apiserver can run on the test machines, and mocking the client library would miss
the client's real behaviour (how it builds URLs, encodes `watch=True`, parses a watch
stream, maps a 410). So this is an aiohttp server on 127.0.0.1 that speaks the real
protocol for the resources the controller uses -- EndpointSlices, Pods, Leases, ConfigMaps
-- and the real client (kubernetes_asyncio, and kubectl as an independent second client)
talks to it over HTTP.

What it implements, as the API server does:
- discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`, `/version`);
- list with `metadata.resourceVersion` and `labelSelector` (=, ==, !=, exists, !exists,
  in, notin);
- watch (`watch=true` or `watch=True`) as chunked JSON lines, from a resourceVersion or
  (none/"0") from synthetic ADDED events; `timeoutSeconds`; BOOKMARK events with
  `allowWatchBookmarks`; a label change in or out of the selector is ADDED / DELETED;
  a resourceVersion older than the last `compact()` is an ERROR event carrying a 410
  Expired Status (or an HTTP 410, with `gone_as_http`);
- get, create (409 AlreadyExists), replace (404; 409 Conflict on a stale
  `metadata.resourceVersion`), merge-patch (same 409), delete (404; preconditions);
- every body with Content-Type exactly `application/json`; errors are `Status` objects.

Test hooks: `put`/`remove`/`get` objects directly (events go out as for API writes),
`compact()`, `hold_watches()`/`release_watches()` (close the open watches and keep new ones
waiting: a gap in which changes can happen unseen), `refuse()` (answer a status, hang, or
hold until released, for matching requests), and `requests` (every request seen; `unknown` lists paths it could not
route, so a new client call shows up as a test failure rather than a silent 404).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

JSON = "application/json"


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = {
    r.plural: r
    for r in (
        Resource("", "v1", "configmaps", "ConfigMap", ("cm",)),
        Resource("", "v1", "pods", "Pod", ("po",)),
        Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
        Resource("coordination.k8s.io", "v1", "leases", "Lease"),
    )
}
GROUPS = sorted({r.group for r in RESOURCES.values() if r.group})

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)


class ApiStatus(Exception):
    """An error answer: a Status object with its code."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def body(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def json_response(body: Any, status: int = 200) -> web.Response:
    # Exactly `application/json`, no charset parameter: some clients compare the header verbatim.
    return web.Response(body=json.dumps(body).encode(), status=status, headers={"Content-Type": JSON})


# -- label selectors ------------------------------------------------------------------------

_SET_EXPR = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_requirements(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_selector(selector: str) -> Callable[[dict[str, str]], bool]:
    """A label selector (the string form kubectl and the clients send) as a predicate."""
    checks: list[Callable[[dict[str, str]], bool]] = []
    for req in _split_requirements(selector or ""):
        if m := _SET_EXPR.match(req):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in req:
            key, value = (s.strip() for s in req.split("!=", 1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in req:
            key, value = (s.strip() for s in re.split("==?", req, maxsplit=1))
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif req.startswith("!"):
            checks.append(lambda labels, k=req[1:].strip(): k not in labels)
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", req):
            checks.append(lambda labels, k=req: k in labels)
        else:
            raise ApiStatus(400, "BadRequest", f"unable to parse requirement: {req!r}")
    return lambda labels: all(check(labels) for check in checks)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- the server -----------------------------------------------------------------------------

Key = tuple[str, str, str]  # (plural, namespace, name)


@dataclass
class SeenRequest:
    method: str
    path: str
    query: dict[str, str]
    user_agent: str
    authorization: str = ""


@dataclass
class Refusal:
    match: Callable[[SeenRequest], bool]
    mode: str  # "status": answer `status`; "hang": never answer; "delay": answer once `until` is set
    status: int
    until: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Watcher:
    plural: str
    namespace: str | None
    selects: Callable[[dict[str, str]], bool]
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


@dataclass
class _Event:
    rv: int
    plural: str
    namespace: str
    old: dict[str, Any] | None  # before the change (None: created)
    new: dict[str, Any] | None  # after it (None: deleted)


class FakeKubeApi:
    """`async with FakeKubeApi() as api:` serves on `api.url` until the block ends."""

    def __init__(self, *, bookmark_interval_s: float = 0.5) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.rv = 0
        self.compacted_rv = 0  # watches from before this get 410
        self.history: list[_Event] = []
        self.watchers: list[_Watcher] = []
        self.requests: list[SeenRequest] = []
        self.unknown: list[str] = []
        self.refusals: list[Refusal] = []
        self.bookmarks_sent: list[int] = []  # the resourceVersion of each BOOKMARK written
        self.bookmark_interval_s = bookmark_interval_s
        self.gone_as_http = False  # answer a too-old watch with HTTP 410 instead of an ERROR event
        self._watches_open = asyncio.Event()
        self._watches_open.set()
        self._hangs = asyncio.Event()  # set at shutdown: hanging requests end
        self.url = ""

    # -- lifecycle ----------------------------------------------------------------------------
    async def __aenter__(self) -> FakeKubeApi:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._hangs.set()
        self._watches_open.set()
        for w in list(self.watchers):
            w.queue.put_nowait(None)
        await self._runner.cleanup()

    # -- test hooks ---------------------------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or overwrite `obj` (kind from its `kind`), as a controller in the cluster would."""
        res = next(r for r in RESOURCES.values() if r.kind == obj["kind"])
        meta = obj["metadata"]
        key = (res.plural, meta.get("namespace", "default"), meta["name"])
        return self._write(key, copy.deepcopy(obj), old=self.objects.get(key))

    def remove(self, plural: str, namespace: str, name: str) -> None:
        key = (plural, namespace, name)
        old = self.objects.pop(key)
        self._record(key, old, None)

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def compact(self) -> None:
        """Forget history up to now: a watch resuming from an older version gets 410."""
        self.compacted_rv = self.rv
        self.history.clear()

    def hold_watches(self) -> None:
        """Close every open watch; new watch requests wait until `release_watches()`."""
        self._watches_open.clear()
        for w in list(self.watchers):
            w.queue.put_nowait(None)

    def release_watches(self) -> None:
        self._watches_open.set()

    def refuse(self, match: Callable[[SeenRequest], bool], *, mode: str = "status", status: int = 503) -> Refusal:
        refusal = Refusal(match, mode, status)
        self.refusals.append(refusal)
        return refusal

    def count(self, method: str, path_part: str, *, watch: bool | None = None) -> int:
        return sum(
            1
            for r in self.requests
            if r.method == method and path_part in r.path and (watch is None or _is_watch(r.query) == watch)
        )

    # -- storage ------------------------------------------------------------------------------
    def _write(self, key: Key, obj: dict[str, Any], *, old: dict[str, Any] | None) -> dict[str, Any]:
        plural, namespace, name = key
        res = RESOURCES[plural]
        self.rv += 1
        meta = obj.setdefault("metadata", {})
        meta.update(name=name, namespace=namespace, resourceVersion=str(self.rv))
        if old is None:
            meta["uid"] = meta.get("uid") or str(uuid.uuid4())  # a test may pin it (targetRef.uid)
            meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["generation"] = 1
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        self.objects[key] = obj
        self._record(key, old, obj, rv=self.rv)
        return copy.deepcopy(obj)

    def _record(
        self, key: Key, old: dict[str, Any] | None, new: dict[str, Any] | None, *, rv: int | None = None
    ) -> None:
        if rv is None:  # a delete also moves the version
            self.rv += 1
            rv = self.rv
            old = copy.deepcopy(old)
            assert old is not None
            old["metadata"]["resourceVersion"] = str(rv)
        event = _Event(rv, key[0], key[1], copy.deepcopy(old), copy.deepcopy(new))
        self.history.append(event)
        for w in self.watchers:
            out = _event_for(w, event)
            if out is not None:
                w.queue.put_nowait(out)

    # -- HTTP ---------------------------------------------------------------------------------
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        seen = SeenRequest(
            request.method,
            request.path,
            dict(request.query),
            request.headers.get("User-Agent", ""),
            request.headers.get("Authorization", ""),
        )
        self.requests.append(seen)
        for refusal in list(self.refusals):
            if refusal.match(seen):
                if refusal.mode == "delay":
                    await refusal.until.wait()
                    break
                if refusal.mode == "hang":
                    await self._hangs.wait()
                return json_response(
                    status_object(refusal.status, "ServiceUnavailable", "refused by the test"), status=refusal.status
                )
        try:
            return await self._route(request, seen)
        except ApiStatus as exc:
            return json_response(exc.body(), status=exc.code)

    async def _route(self, request: web.Request, seen: SeenRequest) -> web.StreamResponse:
        if request.method == "GET":
            doc = self._discovery(request.path)
            if doc is not None:
                return json_response(doc)
        m = _PATH.match(request.path)
        res = RESOURCES.get(m.group("plural")) if m else None
        if (
            m is None
            or res is None
            or (m.group("core") is None and (m.group("group"), m.group("version")) != (res.group, res.version))
            or (m.group("core") is not None and res.group)
        ):
            self.unknown.append(f"{request.method} {request.path}")
            raise ApiStatus(404, "NotFound", "the server could not find the requested resource")
        namespace, name = m.group("ns"), m.group("name")
        if name is None:
            if request.method == "GET":
                if _is_watch(seen.query):
                    return await self._watch(request, res, namespace, seen.query)
                return json_response(self._list(res, namespace, seen.query))
            if request.method == "POST" and namespace is not None:
                return json_response(self._create(res, namespace, await _body(request)), status=201)
        elif namespace is not None:
            key = (res.plural, namespace, name)
            if request.method == "GET":
                return json_response(self._current(res, key))
            if request.method == "PUT":
                return json_response(self._replace(res, key, await _body(request)))
            if request.method == "PATCH":
                return json_response(self._patch(res, key, request.content_type, await _body(request)))
            if request.method == "DELETE":
                return json_response(self._delete(res, key, await _body(request, optional=True)))
        raise ApiStatus(405, "MethodNotAllowed", f"{request.method} is not supported on {request.path}")

    def _discovery(self, path: str) -> dict[str, Any] | None:
        path = path.rstrip("/")
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake", "platform": "linux/amd64"}
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }
        if path == "/apis":
            groups = [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
                }
                for g in GROUPS
            ]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/") if path.startswith("/apis/") else None
        if gv is None:
            return None
        listed = [r for r in RESOURCES.values() if r.api_version == gv]
        if not listed:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {
                    "name": r.plural,
                    "singularName": r.kind.lower(),
                    "namespaced": True,
                    "kind": r.kind,
                    "verbs": list(r.verbs),
                    "shortNames": list(r.short_names),
                }
                for r in listed
            ],
        }

    def _matching(self, res: Resource, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        selects = parse_selector(selector)
        return [
            copy.deepcopy(obj)
            for (plural, ns, _), obj in sorted(self.objects.items())
            if plural == res.plural
            and (namespace is None or ns == namespace)
            and selects(obj["metadata"].get("labels") or {})
        ]

    def _list(self, res: Resource, namespace: str | None, query: dict[str, str]) -> dict[str, Any]:
        items = self._matching(res, namespace, query.get("labelSelector", ""))
        for item in items:  # the API server leaves these out of list items
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    async def _watch(
        self, request: web.Request, res: Resource, namespace: str | None, query: dict[str, str]
    ) -> web.StreamResponse:
        timeout_s = float(query.get("timeoutSeconds") or 1800)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                await self._watches_open.wait()
        except TimeoutError:
            pass
        selects = parse_selector(query.get("labelSelector", ""))
        since = query.get("resourceVersion") or "0"
        if since != "0" and int(since) < self.compacted_rv and self.gone_as_http:
            raise ApiStatus(410, "Expired", f"too old resource version: {since} ({self.compacted_rv})")
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        watcher = _Watcher(res.plural, namespace, selects)
        if since != "0" and int(since) < self.compacted_rv:
            # The real server answers 200 and then this one ERROR event.
            await _send(
                resp,
                {
                    "type": "ERROR",
                    "object": status_object(410, "Expired", f"too old resource version: {since} ({self.compacted_rv})"),
                },
            )
            return resp
        if since == "0":
            for obj in self._matching(res, namespace, query.get("labelSelector", "")):
                watcher.queue.put_nowait({"type": "ADDED", "object": obj})
        else:
            for event in self.history:
                if event.rv > int(since) and (out := _event_for(watcher, event)) is not None:
                    watcher.queue.put_nowait(out)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "True", "1")
        self.watchers.append(watcher)
        try:
            while True:
                wait_s = deadline - loop.time()
                if wait_s <= 0:
                    break
                if bookmarks:
                    wait_s = min(wait_s, self.bookmark_interval_s)
                try:
                    async with asyncio.timeout(wait_s):
                        item = await watcher.queue.get()
                except TimeoutError:
                    if bookmarks and loop.time() < deadline:
                        self.bookmarks_sent.append(self.rv)
                        await _send(
                            resp,
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "kind": res.kind,
                                    "apiVersion": res.api_version,
                                    "metadata": {"resourceVersion": str(self.rv)},
                                },
                            },
                        )
                    continue
                if item is None:  # closed by a test hook or shutdown
                    break
                await _send(resp, item)
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self.watchers.remove(watcher)
        return resp

    def _current(self, res: Resource, key: Key) -> dict[str, Any]:
        obj = self.objects.get(key)
        if obj is None:
            raise ApiStatus(
                404,
                "NotFound",
                f'{res.plural}.{res.group or "core"} "{key[2]}" not found',
                {"name": key[2], "kind": res.plural, "group": res.group},
            )
        return copy.deepcopy(obj)

    def _create(self, res: Resource, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise ApiStatus(422, "Invalid", f"{res.kind}: metadata.name: Required value")
        key = (res.plural, namespace, name)
        if key in self.objects:
            raise ApiStatus(
                409,
                "AlreadyExists",
                f'{res.plural} "{name}" already exists',
                {"name": name, "kind": res.plural, "group": res.group},
            )
        body["metadata"].pop("resourceVersion", None)
        body["metadata"].pop("uid", None)
        return self._write(key, body, old=None)

    def _check_version(self, res: Resource, key: Key, given: str | None) -> dict[str, Any]:
        current = self._current(res, key)
        if given and given != current["metadata"]["resourceVersion"]:
            raise ApiStatus(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {res.plural} "{key[2]}": the '
                "object has been modified; please apply your changes to the latest version and try "
                "again",
                {"name": key[2], "kind": res.plural, "group": res.group},
            )
        return current

    def _replace(self, res: Resource, key: Key, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, key[2]):
            raise ApiStatus(400, "BadRequest", "the name of the object does not match the name on the URL")
        current = self._check_version(res, key, meta.get("resourceVersion"))
        return self._write(key, body, old=current)

    def _patch(self, res: Resource, key: Key, content_type: str, body: dict[str, Any]) -> dict[str, Any]:
        if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            raise ApiStatus(415, "UnsupportedMediaType", f"the fake does not speak {content_type!r}")
        current = self._check_version(res, key, (body.get("metadata") or {}).get("resourceVersion"))
        patched = merge_patch(current, body)
        return self._write(key, patched, old=current)

    def _delete(self, res: Resource, key: Key, body: dict[str, Any] | None) -> dict[str, Any]:
        given = ((body or {}).get("preconditions") or {}).get("resourceVersion")
        current = self._check_version(res, key, given)
        del self.objects[key]
        self._record(key, current, None)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": key[2], "kind": res.plural, "group": res.group, "uid": current["metadata"]["uid"]},
        }


def _is_watch(query: dict[str, str]) -> bool:
    # kubernetes_asyncio sends Python's `True`; kubectl sends `true`.
    return query.get("watch") in ("true", "True", "1")


def _event_for(w: _Watcher, event: _Event) -> dict[str, Any] | None:
    """What watcher `w` sees of `event`: a label change across its selector is ADDED/DELETED."""
    if event.plural != w.plural or (w.namespace is not None and event.namespace != w.namespace):
        return None
    was = event.old is not None and w.selects(event.old["metadata"].get("labels") or {})
    now = event.new is not None and w.selects(event.new["metadata"].get("labels") or {})
    if now:
        return {"type": "MODIFIED" if was else "ADDED", "object": copy.deepcopy(event.new)}
    if was:
        gone = copy.deepcopy(event.new if event.new is not None else event.old)
        assert gone is not None
        gone["metadata"]["resourceVersion"] = str(event.rv)
        return {"type": "DELETED", "object": gone}
    return None


async def _send(resp: web.StreamResponse, event: dict[str, Any]) -> None:
    await resp.write(json.dumps(event).encode() + b"\n")


async def _body(request: web.Request, *, optional: bool = False) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip() and optional:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiStatus(400, "BadRequest", f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiStatus(400, "BadRequest", "body must be an object")
    return body


# -- object builders for tests ----------------------------------------------------------------


def endpoint(
    pod: str, ip: str, *, ready: bool | None = True, namespace: str = "default", terminating: bool | None = None
) -> dict[str, Any]:
    conditions: dict[str, Any] = {}
    if ready is not None:
        conditions["ready"] = ready
        conditions["serving"] = ready
    if terminating is not None:
        conditions["terminating"] = terminating
    return {
        "addresses": [ip],
        "conditions": conditions,
        "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": f"uid-{pod}"},
    }


def endpoint_slice(
    name: str,
    endpoints: list[dict[str, Any]],
    *,
    ports: dict[str, int] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
    address_type: str = "IPv4",
) -> dict[str, Any]:
    ports = ports if ports is not None else {"admin": 8101, "inference": 8100}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels if labels is not None else {"kubernetes.io/service-name": "rl-workers"},
    }
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports.items()],
    }


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}, "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "agent", "image": "rl-agent"}]},
    }


@asynccontextmanager
async def fake_kube_api(**kwargs: Any) -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi(**kwargs) as api:
        yield api

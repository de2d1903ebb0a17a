"""The controller app factory: one aiohttp session, the controller, its background tasks.

Each resource is set up and torn down in its own cleanup_ctx, in order: the client
session, the Kubernetes API client (only when a setting needs one), then the controller
(desired state loaded), then the named background loops (discovery, status poller,
reconciler, and the Lease elector with leader election), cancelled and awaited on shutdown.

With leader election, a follower serves reads and answers every write with 409
`not_leader` naming the leader (`leader_middleware`); the leader runs each write as a task
that losing the Lease cancels at once (see `controlplane/k8s/leadership.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from agents.admin.http import make_auth_middleware, make_error_middleware
from agents.openapi import serve_document
from controlplane.api.facade import facade
from controlplane.api.openapi import ROUTES, controller_document
from controlplane.api.routes import CONTROLLER, routes
from controlplane.controller import Controller
from controlplane.discovery.base import DiscoverySource
from controlplane.k8s.leadership import Leadership
from controlplane.settings import ControllerSettings
from controlplane.store import DesiredStore, FileStore, MemoryStore

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

SESSION = web.AppKey("session", aiohttp.ClientSession)
KUBE_API: web.AppKey[ApiClient | None] = web.AppKey("kube_api")
LEADERSHIP = web.AppKey("leadership", Leadership)
# Probes (and the API document) answer without the token even when reads are protected.
_OPEN_PATHS = frozenset(r.path for r in ROUTES if r.probe)
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def needs_kubernetes(settings: ControllerSettings) -> bool:
    return (settings.discovery.kind == "kubernetes" or settings.leader_election.enabled
            or settings.store.kind == "configmap")


def make_store(settings: ControllerSettings, *, kube_api: ApiClient | None = None,
               leadership: Leadership | None = None) -> DesiredStore:
    if settings.store.kind == "memory":
        return MemoryStore()
    if settings.store.kind == "file":
        return FileStore(settings.store.path)
    if settings.store.kind == "configmap":
        from controlplane.k8s.configmap_store import ConfigMapStore

        assert kube_api is not None and leadership is not None
        return ConfigMapStore(api=kube_api, name=settings.store.configmap_name, namespace=settings.store.namespace,
                              leadership=leadership, request_timeout_s=settings.kubernetes.request_timeout_s)
    raise ValueError(f"store kind {settings.store.kind!r} is not available in this build")


def make_source(settings: ControllerSettings, session: aiohttp.ClientSession, *,
                kube_api: ApiClient | None = None) -> DiscoverySource:
    d = settings.discovery
    if d.kind == "kubernetes":
        from controlplane.k8s.discovery import EndpointSliceSource

        assert d.kubernetes is not None and kube_api is not None
        return EndpointSliceSource(api=kube_api, settings=d.kubernetes,
                                   request_timeout_s=settings.kubernetes.request_timeout_s)
    if d.kind == "static":
        from controlplane.discovery.static import StaticSource

        return StaticSource(d.static)
    if d.kind == "http_listing":
        from controlplane.discovery.http_listing import HttpListingSource

        assert d.http_listing is not None
        token = d.http_listing.token.get_secret_value() if d.http_listing.token else None
        return HttpListingSource(session=session, url=d.http_listing.url, interval_s=d.http_listing.interval_s,
                                 timeout_s=d.http_listing.timeout_s, token=token,
                                 default_flavor=d.http_listing.default_flavor)
    raise ValueError(f"discovery kind {d.kind!r} is not available in this build")


def build_app(settings: ControllerSettings, *, token: str, store: DesiredStore | None = None,
              source: DiscoverySource | None = None, background: bool = True) -> web.Application:
    """`background=False` leaves the loops to the caller (tests drive them step by step)."""
    app = web.Application(
        client_max_size=settings.api.max_body_bytes,
        middlewares=[make_error_middleware(settings.api.max_body_bytes),
                     make_auth_middleware(token, auth_reads=settings.api.auth_reads, open_paths=_OPEN_PATHS),
                     leader_middleware],
    )
    app.add_routes(routes)
    app.add_routes(facade)
    serve_document(app, controller_document(auth_reads=settings.api.auth_reads))

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        # One session for every worker call; connection reuse is most of fan-out speed.
        connector = aiohttp.TCPConnector(limit=settings.workers.max_concurrency * 2, limit_per_host=8)
        async with aiohttp.ClientSession(connector=connector) as session:
            app[SESSION] = session
            yield

    async def kube_ctx(app: web.Application) -> AsyncIterator[None]:
        # One Kubernetes API client (its own aiohttp session) for discovery, Lease and store.
        app[KUBE_API] = None
        if not needs_kubernetes(settings):
            yield
            return
        from controlplane.k8s.client import make_api_client

        api = await make_api_client(settings.kubernetes, user_agent=f"rl-controlplane/{settings.controller_id} "
                                                                    f"({settings.leader_election.identity})")
        app[KUBE_API] = api
        try:
            yield
        finally:
            await api.close()

    async def controller_ctx(app: web.Application) -> AsyncIterator[None]:
        session, kube_api = app[SESSION], app[KUBE_API]
        le = settings.leader_election
        leadership = Leadership(le.identity) if le.enabled else Leadership.always(le.identity)
        app[LEADERSHIP] = leadership
        ctl = Controller(settings, session=session,
                         store=store or make_store(settings, kube_api=kube_api, leadership=leadership),
                         source=source or make_source(settings, session, kube_api=kube_api), leadership=leadership)
        await ctl.load_desired()
        app[CONTROLLER] = ctl
        tasks: list[asyncio.Task[None]] = []
        if background:
            tasks = [asyncio.create_task(ctl.run_discovery(), name="discovery"),
                     asyncio.create_task(ctl.run_poller(), name="status-poller"),
                     asyncio.create_task(ctl.run_reconciler(), name="reconciler")]
        elector: asyncio.Task[None] | None = None
        if le.enabled:
            from controlplane.k8s.lease import LeaseElector

            assert kube_api is not None
            elector = asyncio.create_task(LeaseElector(api=kube_api, settings=le, leadership=leadership,
                                                       request_timeout_s=settings.kubernetes.request_timeout_s).run(),
                                          name="lease-elector")
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if elector is not None:  # last: it hands the Lease back once nothing here mutates
            elector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await elector

    app.cleanup_ctx.extend([session_ctx, kube_ctx, controller_ctx])
    return app


@web.middleware
async def leader_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Writes only on the leader, each cancelled the moment leadership is lost; reads anywhere."""
    if request.method in _READS or request.path in _OPEN_PATHS:
        return await handler(request)
    ctl = request.app[CONTROLLER]
    await ctl.ensure_leading()
    return await ctl.leadership.run_as_leader(handler(request), name=f"{request.method} {request.path}")

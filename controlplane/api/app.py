"""The controller app factory: one aiohttp session, the controller, its background tasks.

Each resource is set up and torn down in its own cleanup_ctx, in order: the client
session, then the controller (desired state loaded), then the named background loops
(discovery, status poller, reconciler), cancelled and awaited on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from agents.admin.http import make_auth_middleware, make_error_middleware
from controlplane.api.facade import facade
from controlplane.api.routes import CONTROLLER, routes
from controlplane.controller import Controller
from controlplane.discovery.base import DiscoverySource
from controlplane.settings import ControllerSettings
from controlplane.store import DesiredStore, FileStore, MemoryStore

SESSION = web.AppKey("session", aiohttp.ClientSession)
_OPEN_PATHS = frozenset({"/healthz", "/readyz", "/health"})


def make_store(settings: ControllerSettings) -> DesiredStore:
    if settings.store.kind == "memory":
        return MemoryStore()
    if settings.store.kind == "file":
        return FileStore(settings.store.path)
    raise ValueError(f"store kind {settings.store.kind!r} is not available in this build")


def make_source(settings: ControllerSettings, session: aiohttp.ClientSession) -> DiscoverySource:
    d = settings.discovery
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
                     make_auth_middleware(token, auth_reads=settings.api.auth_reads, open_paths=_OPEN_PATHS)],
    )
    app.add_routes(routes)
    app.add_routes(facade)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        # One session for every worker call; connection reuse is most of fan-out speed.
        connector = aiohttp.TCPConnector(limit=settings.workers.max_concurrency * 2, limit_per_host=8)
        async with aiohttp.ClientSession(connector=connector) as session:
            app[SESSION] = session
            yield

    async def controller_ctx(app: web.Application) -> AsyncIterator[None]:
        session = app[SESSION]
        ctl = Controller(settings, session=session, store=store or make_store(settings),
                         source=source or make_source(settings, session))
        await ctl.load_desired()
        app[CONTROLLER] = ctl
        tasks: list[asyncio.Task[None]] = []
        if background:
            tasks = [asyncio.create_task(ctl.run_discovery(), name="discovery"),
                     asyncio.create_task(ctl.run_poller(), name="status-poller"),
                     asyncio.create_task(ctl.run_reconciler(), name="reconciler")]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.cleanup_ctx.extend([session_ctx, controller_ctx])
    return app

"""The controller app factory: one aiohttp session, the controller, its background tasks.

Each resource is set up and torn down in its own cleanup_ctx, in order: the client
session, the Kubernetes API client (only when a setting needs one), then the controllers
(one per fleet, desired states loaded) with their background loops (`supervisor.py`:
discovery, status observers, reconcilers, and the Lease elector with leader election),
stopped on shutdown.

The default fleet is served at the root; each named fleet (settings `fleets`) has the same
routes in a sub-application under `/fleets/<name>/`, so a client written for one server
drives a fleet given that base URL. Handlers find their fleet's controller and the shared
session through `request.config_dict` (the innermost application's first).

With leader election, a follower serves reads and answers every write with 409
`not_leader` naming the leader (`leader_middleware`); the leader runs each write as a task
that losing the Lease cancels at once (see `rlcp/controlplane/leadership/guard.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from rlcp.controlplane.api import facade, facade_rpc, fleets, routes, unsupported
from rlcp.controlplane.api.errors import to_api_error
from rlcp.controlplane.api.fleets import FLEETS
from rlcp.controlplane.api.openapi import ROUTES, controller_document
from rlcp.controlplane.api.routes import CONTROLLER, SESSION
from rlcp.controlplane.controller import Controller, TransportFactory, http_transports
from rlcp.controlplane.discovery.base import DiscoverySource
from rlcp.controlplane.discovery.factory import make_source
from rlcp.controlplane.errors import NotFound
from rlcp.controlplane.fleet.names import ModelNames
from rlcp.controlplane.fleet.served import ServedModels
from rlcp.controlplane.fleets import Fleets
from rlcp.controlplane.gateway.app import new_session
from rlcp.controlplane.gateway.local import start_local_gateway
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.persistence.base import DesiredStore
from rlcp.controlplane.persistence.factory import make_store
from rlcp.controlplane.settings import DEFAULT_FLEET, ControllerSettings, fleet_path
from rlcp.controlplane.supervisor import start_loops
from rlcp.core.body import BODY_HANDLER_ARGS
from rlcp.core.http import make_auth_middleware, make_error_middleware
from rlcp.core.openapi import open_paths, serve_document

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

KUBE_API: web.AppKey[ApiClient | None] = web.AppKey("kube_api")
LEADERSHIP = web.AppKey("leadership", Leadership)
GATEWAY = web.AppKey("gateway", Gateway)  # set when the inference gateway runs in this process
ENVOY_XDS_PORT = web.AppKey("envoy_xds_port", int)  # set when the controller serves Envoy the fence over xDS
# Probes (and the API document) answer without the token even when reads are protected.
_OPEN_PATHS = open_paths(ROUTES)
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def needs_kubernetes(settings: ControllerSettings) -> bool:
    return (settings.discovery.kind == "kubernetes" or settings.leader_election.enabled
            or settings.store.kind == "configmap")


def build_app(settings: ControllerSettings, *, token: str, store: DesiredStore | None = None,
              source: DiscoverySource | None = None, transports: TransportFactory | None = None,
              background: bool = True, gateway: bool | None = None) -> web.Application:
    """`background=False` leaves the loops to the caller (tests drive them step by step);
    `transports` replaces HTTP to the workers (tests: `MemoryTransport`); `gateway` overrides
    `settings.gateway.enabled` (the inference gateway on its own port)."""
    run_gateway = settings.gateway.enabled if gateway is None else gateway
    app = web.Application(
        client_max_size=settings.api.max_body_bytes, handler_args=BODY_HANDLER_ARGS,
        middlewares=[make_error_middleware(settings.api.max_body_bytes, translate=to_api_error),
                     make_auth_middleware(token, auth_reads=settings.api.auth_reads, open_paths=_OPEN_PATHS),
                     unknown_fleet_middleware(list(settings.fleets)), leader_middleware],
    )
    serve_fleet_routes(app)
    fleets.api.register(app)
    serve_document(app, controller_document(auth_reads=settings.api.auth_reads))
    named_apps: dict[str, web.Application] = {}
    for name in settings.fleets:
        named_apps[name] = sub = web.Application(client_max_size=settings.api.max_body_bytes,
                                                 handler_args=BODY_HANDLER_ARGS)
        serve_fleet_routes(sub)
        serve_document(sub, controller_document(auth_reads=settings.api.auth_reads, fleet=name))
        app.add_subapp(fleet_path(name), sub)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        # One session for every worker call; connection reuse is most of fan-out speed.
        connector = aiohttp.TCPConnector(limit=settings.workers.max_concurrency * 2, limit_per_host=8)
        # No session-wide timeout: every call is bounded by its own deadline (WorkerTransport),
        # and aiohttp's default would arm a second timer per request (~4% of fan-out CPU).
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            app[SESSION] = session
            yield

    async def kube_ctx(app: web.Application) -> AsyncIterator[None]:
        # One Kubernetes API client (its own aiohttp session) for discovery, Lease and store.
        app[KUBE_API] = None
        if not needs_kubernetes(settings):
            yield
            return
        from rlcp.controlplane.k8s.client import make_api_client

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
        make_transport = transports or http_transports(session, settings.workers.resolved_token())
        names = ModelNames()  # one model name, one fleet: every fleet's controller checks a new name here

        def make_controller(fleet: str) -> Controller:
            # `store` (tests) is the default fleet's; a named fleet's comes from the settings.
            own = store if store is not None and fleet == DEFAULT_FLEET else make_store(
                settings, kube_api=kube_api, leadership=leadership, fleet=fleet)
            return Controller(settings, transports=make_transport, store=own, leadership=leadership, fleet=fleet,
                              names=names)

        every = Fleets(make_controller(DEFAULT_FLEET), {name: make_controller(name) for name in settings.fleets})
        for each in every:
            await each.load_desired()
        app[CONTROLLER] = every.default
        app[FLEETS] = every
        for name, sub in named_apps.items():
            sub[CONTROLLER] = every.named[name]
        elector = None
        if le.enabled:
            from rlcp.controlplane.leadership.lease import LeaseElector

            assert kube_api is not None
            elector = LeaseElector(api=kube_api, settings=le, leadership=leadership,
                                   request_timeout_s=settings.kubernetes.request_timeout_s).run
        supervisor = start_loops(every, source=source or make_source(settings, session, kube_api=kube_api),
                                 elector=elector, background=background)
        async with contextlib.AsyncExitStack() as stack:
            if run_gateway and settings.gateway.data_plane == "envoy":
                # The `envoy` extra: grpc and the generated Envoy API, imported only here.
                from rlcp.controlplane.gateway.envoy.local import start_envoy_plane

                plane = await start_envoy_plane(every, settings.gateway.envoy)
                app[ENVOY_XDS_PORT] = plane.port
                stack.push_async_callback(plane.close)
            elif run_gateway:
                # Its own session: rollouts are many long requests per worker, admin calls few.
                gateway_session = await stack.enter_async_context(new_session())
                gateway_obj, runner = await start_local_gateway(every, settings.gateway, gateway_session,
                                                                admin_token=token)
                app[GATEWAY] = gateway_obj
                stack.push_async_callback(runner.cleanup)
            yield
            for each in every:
                await each.detached.close()
            await supervisor.stop()

    app.cleanup_ctx.extend([session_ctx, kube_ctx, controller_ctx])
    return app


def serve_fleet_routes(app: web.Application) -> None:
    """The routes of one fleet: the native API, the vLLM-shaped facade, and its 501s."""
    routes.api.register(app)
    facade.api.register(app)
    facade_rpc.api.register(app)
    unsupported.api.register(app)
    app[facade.SERVED_MODELS] = ServedModels()


def unknown_fleet_middleware(names: list[str]) -> Middleware:
    """A path under `/fleets/<name>/` for a fleet the settings do not name is a 404 that says
    so and lists the fleets, not a bare "Not Found" (a typo in a trainer's base URL)."""
    kept = ", ".join(["default (at /)", *(f"{n} (at {fleet_path(n)})" for n in names)])

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.http_exception is not None and request.path.startswith("/fleets/"):
            name = request.path.split("/")[2]
            if name not in names:
                raise NotFound(f"no fleet {name!r}: this controller keeps {kept}", field="fleet")
        return await handler(request)

    return middleware


@web.middleware
async def leader_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Writes only on the leader, each cancelled the moment leadership is lost; reads anywhere."""
    if request.method in _READS or request.path in _OPEN_PATHS:
        return await handler(request)
    ctl = request.config_dict[CONTROLLER]
    await ctl.ensure_leading()

    async def handle() -> web.StreamResponse:  # a coroutine for the task, whatever awaitable the handler gives
        return await handler(request)

    return await ctl.leadership.run_as_leader(handle(), name=f"{request.method} {request.path}")

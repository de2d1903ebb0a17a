"""The composition root: the controller process assembled from its parts.

`api/app.py` is only the HTTP application (routes, middlewares, a sub-application per named
fleet). This module gives it what the handlers find through the application's keys, each
resource set up and torn down in a cleanup context of its own, in this order (aiohttp tears
them down in the reverse one):

    session       one client session for every call to the workers
    kubernetes    one Kubernetes API client, only when a setting needs one (discovery,
                  Lease, ConfigMap store)
    fleets        the leadership guard and a `Controller` per fleet over one `ModelNames`,
                  desired states loaded
    loops         the background loops (`supervisor.py`: discovery, status observers,
                  reconcilers, the Lease elector with leader election)
    operations    updates that run on without a waiting caller (`wait: false`), cancelled
                  on shutdown
    gateway       the inference gateway on its own port (its own session and site), or
                  Envoy as its data plane fed over xDS; only when enabled. Each of the two
                  applications answers the other's routes (one URL, `rlcp.core.handover`)

so the gateway goes first on shutdown (no rollout is routed by a fleet that stopped), then
the detached operations, then the loops, the elector last among them: the Lease is handed
back only once nothing mutates the fleet any more.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import TYPE_CHECKING

import aiohttp
import structlog
from aiohttp import web

from rlcp.controlplane.api.app import FLEET_APPS, build_http_app
from rlcp.controlplane.api.fleets import FLEETS
from rlcp.controlplane.api.handling import CONTROLLER, SESSION
from rlcp.controlplane.controller import Controller, TransportFactory, http_transports
from rlcp.controlplane.discovery.base import DiscoverySource
from rlcp.controlplane.discovery.factory import make_source
from rlcp.controlplane.fleet.names import ModelNames
from rlcp.controlplane.fleetnames import DEFAULT_FLEET
from rlcp.controlplane.fleets import Fleets
from rlcp.controlplane.gateway.app import new_session
from rlcp.controlplane.gateway.local import start_local_gateway
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.persistence.base import DesiredStore
from rlcp.controlplane.persistence.factory import make_store
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.supervisor import start_loops
from rlcp.core.handover import PEER, Peer

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

KUBE_API: web.AppKey[ApiClient | None] = web.AppKey("kube_api")
LEADERSHIP = web.AppKey("leadership", Leadership)
GATEWAY = web.AppKey("gateway", Gateway)  # set when the inference gateway runs in this process
ENVOY_XDS_PORT = web.AppKey("envoy_xds_port", int)  # set when the controller serves Envoy the fence over xDS


def needs_kubernetes(settings: ControllerSettings) -> bool:
    return (
        settings.discovery.kind == "kubernetes"
        or settings.leader_election.enabled
        or settings.store.kind == "configmap"
    )


def assemble(
    settings: ControllerSettings,
    *,
    token: str,
    store: DesiredStore | None = None,
    source: DiscoverySource | None = None,
    transports: TransportFactory | None = None,
    background: bool = True,
    gateway: bool | None = None,
) -> web.Application:
    """The controller's application with every resource it runs on.

    `background=False` leaves the loops to the caller (tests drive them step by step);
    `transports` replaces HTTP to the workers (tests: `MemoryTransport`); `store` is the
    default fleet's desired store (tests); `gateway` overrides `settings.gateway.enabled`
    (the inference gateway on its own port)."""
    app = build_http_app(settings, token=token)
    if settings.api.allow_anonymous:
        structlog.get_logger("rlcp.controlplane").warning(
            "anonymous_admin_allowed",
            host=settings.api.host,
            port=settings.api.port,
            message="api.allow_anonymous: a request with no Authorization header drives the fleet; "
            "keep this port on loopback or behind a NetworkPolicy (docs/operator-guide.md)",
        )
    app.cleanup_ctx.extend(
        [
            partial(_session_ctx, settings=settings),
            partial(_kube_ctx, settings=settings),
            partial(_fleets_ctx, settings=settings, store=store, transports=transports),
            partial(_loops_ctx, settings=settings, source=source, background=background),
            _operations_ctx,
        ]
    )
    if settings.gateway.enabled if gateway is None else gateway:
        app.cleanup_ctx.append(
            partial(_envoy_ctx, settings=settings)
            if settings.gateway.data_plane == "envoy"
            else partial(_local_gateway_ctx, settings=settings, token=token)
        )
    return app


# Each resource's cleanup context, in the order of the module docstring; `assemble` binds
# what each needs by keyword.


async def _session_ctx(app: web.Application, *, settings: ControllerSettings) -> AsyncIterator[None]:
    # One session for every worker call; connection reuse is most of fan-out speed.
    connector = aiohttp.TCPConnector(limit=settings.workers.max_concurrency * 2, limit_per_host=8)
    # No session-wide timeout: every call is bounded by its own deadline (WorkerTransport),
    # and aiohttp's default would arm a second timer per request (~4% of fan-out CPU).
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        app[SESSION] = session
        yield


async def _kube_ctx(app: web.Application, *, settings: ControllerSettings) -> AsyncIterator[None]:
    # One Kubernetes API client (its own aiohttp session) for discovery, Lease and store.
    app[KUBE_API] = None
    if not needs_kubernetes(settings):
        yield
        return
    from rlcp.controlplane.k8s.client import make_api_client

    api = await make_api_client(
        settings.kubernetes,
        user_agent=f"rl-controlplane/{settings.controller_id} ({settings.leader_election.identity})",
    )
    app[KUBE_API] = api
    try:
        yield
    finally:
        await api.close()


async def _fleets_ctx(
    app: web.Application,
    *,
    settings: ControllerSettings,
    store: DesiredStore | None,
    transports: TransportFactory | None,
) -> AsyncIterator[None]:
    le = settings.leader_election
    leadership = Leadership(le.identity) if le.enabled else Leadership.always(le.identity)
    app[LEADERSHIP] = leadership
    make_transport = transports or http_transports(app[SESSION], settings.workers.resolved_token())
    names = ModelNames()  # one model name, one fleet: every fleet's controller checks a new name here

    def make_controller(fleet: str) -> Controller:
        # `store` (tests) is the default fleet's; a named fleet's comes from the settings.
        own = (
            store
            if store is not None and fleet == DEFAULT_FLEET
            else make_store(settings, kube_api=app[KUBE_API], leadership=leadership, fleet=fleet)
        )
        return Controller(
            settings, transports=make_transport, store=own, leadership=leadership, fleet=fleet, names=names
        )

    every = Fleets(make_controller(DEFAULT_FLEET), {name: make_controller(name) for name in settings.fleets})
    for each in every:
        await each.load_desired()
    app[FLEETS] = every
    app[CONTROLLER] = every.default
    for name, sub in app[FLEET_APPS].items():
        sub[CONTROLLER] = every.named[name]
    yield


async def _loops_ctx(
    app: web.Application, *, settings: ControllerSettings, source: DiscoverySource | None, background: bool
) -> AsyncIterator[None]:
    kube_api, le = app[KUBE_API], settings.leader_election
    elector = None
    if le.enabled:
        from rlcp.controlplane.leadership.lease import LeaseElector

        assert kube_api is not None  # needs_kubernetes: leader election needs the client
        elector = LeaseElector(
            api=kube_api,
            settings=le,
            leadership=app[LEADERSHIP],
            request_timeout_s=settings.kubernetes.request_timeout_s,
        ).run
    supervisor = start_loops(
        app[FLEETS],
        source=source or make_source(settings, app[SESSION], kube_api=kube_api),
        elector=elector,
        background=background,
    )
    try:
        yield
    finally:
        await supervisor.stop()


async def _operations_ctx(app: web.Application) -> AsyncIterator[None]:
    # Each controller starts its detached operations itself; what is left of them at
    # shutdown is cancelled here, before the loops (and the elector's Lease) stop.
    yield
    for each in app[FLEETS]:
        await each.detached.close()


async def _local_gateway_ctx(app: web.Application, *, settings: ControllerSettings, token: str) -> AsyncIterator[None]:
    # Its own session: rollouts are many long requests per worker, admin calls few.
    async with new_session(settings.gateway.upstream_idle_timeout_s) as gateway_session:
        gateway_obj, runner = await start_local_gateway(
            app[FLEETS],
            settings.gateway,
            gateway_session,
            admin_token=token,
            controller=Peer(app, settings.api.max_body_bytes, outlives_client=True),
        )
        app[GATEWAY] = gateway_obj
        # One URL: inference asked of the controller's port runs through the gateway's app.
        app[PEER] = Peer(runner.app, settings.gateway.max_body_bytes)
        try:
            yield
        finally:
            await runner.cleanup()


async def _envoy_ctx(app: web.Application, *, settings: ControllerSettings) -> AsyncIterator[None]:
    # The `envoy` extra: grpc and the generated Envoy API, imported only here.
    from rlcp.controlplane.gateway.envoy.local import start_envoy_plane

    plane = await start_envoy_plane(app[FLEETS], settings.gateway.envoy)
    app[ENVOY_XDS_PORT] = plane.port
    try:
        yield
    finally:
        await plane.close()

"""The controller's HTTP application: routes, middlewares, and a sub-application per named fleet.

Only the HTTP side: what the handlers run on (the controllers, the client session, the
gateway) is assembled in `rlcp/controlplane/assembly.py`, the composition root, which hands
it over through the application's keys (`CONTROLLER`, `SESSION`, `FLEETS`; each named fleet's
sub-application, listed under `FLEET_APPS`, gets its own `CONTROLLER`).

The default fleet is served at the root; each named fleet (settings `fleets`) has the same
routes in a sub-application under `/fleets/<name>/`, so a client written for one server
drives a fleet given that base URL. Handlers find their fleet's controller and the shared
session through `request.config_dict` (the innermost application's first).

One URL (docs/controller.md): a request this application has no route for, that the
inference gateway routes, is the gateway's (`rlcp.core.handover`). With the gateway in this
process (`assembly.py` sets `PEER`), it runs through the gateway's application as on the
gateway's own port, fence, token check and all. Without one (`gateway.enabled: false`, or
Envoy as the data plane) it is a 404 that says where inference is served.

With leader election, a follower serves reads and answers every write with 409
`not_leader` naming the leader (`leader_middleware`); the leader runs each write as a task
that losing the Lease cancels at once (see `rlcp/controlplane/leadership/guard.py`).
"""

from __future__ import annotations

import functools

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from rlcp.controlplane.api import facade, facade_info, facade_rpc, fleets, routes, unsupported
from rlcp.controlplane.api.errors import to_api_error
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.api.openapi import ROUTES, controller_document
from rlcp.controlplane.errors import NotFound
from rlcp.controlplane.fleet.served import ServedModels
from rlcp.controlplane.fleet.server_config import ServerConfigs
from rlcp.controlplane.fleetnames import fleet_path
from rlcp.controlplane.gateway.app import ROUTES as GATEWAY_ROUTES
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.body import BODY_HANDLER_ARGS
from rlcp.core.errors import NotFoundError
from rlcp.core.handover import Fallback, make_handover_middleware
from rlcp.core.http import make_auth_middleware, make_error_middleware
from rlcp.core.openapi import open_paths, serve_document

# Each named fleet's sub-application, by name: the composition root gives each its controller.
FLEET_APPS = web.AppKey("fleet_apps", dict[str, web.Application])
# Probes (and the API document) answer without the token even when reads are protected.
_OPEN_PATHS = open_paths(ROUTES)
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def build_http_app(settings: ControllerSettings, *, token: str) -> web.Application:
    """The routes and middlewares, with nothing to run them on yet (`assembly.assemble` adds it)."""
    app = web.Application(
        client_max_size=settings.api.max_body_bytes,
        handler_args=BODY_HANDLER_ARGS,
        middlewares=[
            make_error_middleware(settings.api.max_body_bytes, translate=to_api_error),
            make_handover_middleware(fallback=inference_elsewhere(settings)),
            make_auth_middleware(
                token,
                auth_reads=settings.api.auth_reads,
                open_paths=_OPEN_PATHS,
                allow_anonymous=settings.api.allow_anonymous,
            ),
            unknown_fleet_middleware(list(settings.fleets)),
            leader_middleware,
        ],
    )
    serve_fleet_routes(app)
    fleets.api.register(app)
    serve_document(app, functools.partial(controller_document, auth_reads=settings.api.auth_reads))
    named_apps: dict[str, web.Application] = {}
    for name in settings.fleets:
        named_apps[name] = sub = web.Application(
            client_max_size=settings.api.max_body_bytes, handler_args=BODY_HANDLER_ARGS
        )
        serve_fleet_routes(sub)
        serve_document(sub, functools.partial(controller_document, auth_reads=settings.api.auth_reads, fleet=name))
        app.add_subapp(fleet_path(name), sub)
    app[FLEET_APPS] = named_apps
    return app


def serve_fleet_routes(app: web.Application) -> None:
    """The routes of one fleet: the native API, the vLLM-shaped facade, and its 501s."""
    routes.api.register(app)
    facade.api.register(app)
    facade_rpc.api.register(app)
    facade_info.api.register(app)
    unsupported.api.register(app)
    app[facade_info.SERVED_MODELS] = ServedModels()
    app[facade_info.SERVER_CONFIGS] = ServerConfigs()


def inference_elsewhere(settings: ControllerSettings) -> Fallback:
    """With no gateway in this process, an inference route asked of the controller is a 404
    saying where inference is served, rather than a bare "Not Found"."""
    inference = frozenset(r.path for r in GATEWAY_ROUTES if r.tag == "inference")
    g = settings.gateway
    where = (
        f"the fleet's data plane is Envoy (gateway.data_plane: envoy): send it to Envoy's listener "
        f"(port {g.envoy.listen_port} in the bootstrap the controller writes)"
        if g.data_plane == "envoy"
        else "send it to the fleet's gateway (the rl-gateway replicas' URL)"
    )

    async def fallback(request: web.Request) -> web.StreamResponse | None:
        if request.path not in inference:
            return None
        raise NotFoundError(
            f"{request.method} {request.path} is an inference route, and no gateway runs in this "
            f"controller's process: {where}"
        )

    return fallback


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

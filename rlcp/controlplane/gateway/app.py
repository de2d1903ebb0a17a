"""The gateway's HTTP face: its routes (declared once, documented at `/openapi.json`), its
own site with handler cancellation, and the per-request policy headers.

Inference routes -- every one the workers' vLLM serves, listed in `vllm_routes.py` -- pass
through to a worker unchanged (`proxy.py`); the gateway itself only
checks what it reads before any worker is called: the body is a JSON object, the fields it
uses (`stream`, `user`, `nvext`: an object, its `backend_instance_id` left to the fence) have
their types, and the policy headers (`X-RL-Max-Staleness`,
`X-RL-Hold-Timeout`) are in range -- a 4xx naming the field otherwise. Inference needs no
token unless `gateway.token` is set; then the controller's admin token is accepted too
(`gateway.accept_admin_token`), as trainers send one API key to both URLs.

One URL (docs/gateway.md): a request the gateway has no route for is the controller's --
its native API and the vLLM-shaped facade (`rlcp.core.handover`). In the controller's process
it runs through the controller's application directly (`peer`); a standalone gateway forwards
it to the controller it follows (`admin.py`). The controller authorizes it, not the gateway.

A session key pins a rollout's turns to one worker (its prefix cache): the affinity header,
else `X-Session-ID` (what verifiers' clients send, the rollout's trace id), else the body's
`user`. Not `cache_salt`: prime-rl sets it to the policy version, the same for every
rollout of a step, so as a session key it sent a whole step to one worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from rlcp.controlplane.fleet.served import ServedModels, merge_cards
from rlcp.controlplane.gateway import vllm_routes
from rlcp.controlplane.gateway.pinning import check_client_nvext
from rlcp.controlplane.gateway.proxy import Gateway, RequestPolicy
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.body import BODY_HANDLER_ARGS, parse_json, read_body
from rlcp.core.errors import BadRequestError, NotSupportedError, ValidationFailedError
from rlcp.core.handover import PEER, Fallback, Peer, make_handover_middleware
from rlcp.core.http import json_response, make_auth_middleware, make_error_middleware
from rlcp.core.openapi import (
    Handler,
    Route,
    RouteTable,
    build_document,
    built_once,
    open_paths,
    openapi_route,
    serve_document,
)
from rlcp.core.wire.agent.state import ProbeAnswer
from rlcp.core.wire.controller import STALENESS_BOUND_MAX, ModelList

GATEWAY = web.AppKey("gateway", Gateway)
STALENESS_HEADER = "X-RL-Max-Staleness"
HOLD_HEADER = "X-RL-Hold-Timeout"
SESSION_ID_HEADER = "X-Session-ID"  # verifiers' clients: the rollout's trace id, the same every turn
api = RouteTable(json_bodies=False)  # its body-less routes refuse (501), whatever the body
_INFERENCE, _PROBES = "inference", "probes"


class InferenceBody(BaseModel):
    """Whatever the worker's route takes; the gateway reads only these fields."""

    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = Field(None, description="The model or adapter name, checked by the worker.")
    stream: StrictBool | None = Field(None, description="Stream the answer as server-sent events.")
    user: StrictStr | None = Field(None, description="A session key for affinity (after the session headers).")


def _policy(request: web.Request, body: dict[str, Any], gateway: Gateway) -> RequestPolicy:
    settings = gateway.settings
    bound = _header_number(request, STALENESS_HEADER, int, 0, STALENESS_BOUND_MAX)
    hold = _header_number(request, HOLD_HEADER, float, 0.0, 3600.0, exclusive_low=True)
    headers = request.headers
    session = headers.get(settings.affinity_header) or headers.get(SESSION_ID_HEADER) or body.get("user")
    return RequestPolicy(
        bound=bound,
        hold_s=settings.hold_timeout_s if hold is None else hold,
        session=session,
        router=gateway.router_for(body.get("model")),
    )


N = TypeVar("N", int, float)


def _header_number(
    request: web.Request, name: str, kind: type[N], low: float, high: float, *, exclusive_low: bool = False
) -> N | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ValidationFailedError(f"{name} must be a {kind.__name__}, got {raw!r}", field=name) from None
    if not (low < value if exclusive_low else low <= value) or value > high:
        bounds = f"{'above' if exclusive_low else 'at least'} {low:g} and at most {high:g}"
        raise ValidationFailedError(f"{name} must be {bounds}, got {raw!r}", field=name)
    return value


# `InferenceBody`'s fields, checked by hand on the hot path (as strict as the model: JSON has
# types): building the model per request was ~1% of the gateway's CPU for three isinstance checks.
_READ_FIELDS = (("model", str, "a valid string"), ("stream", bool, "a valid boolean"), ("user", str, "a valid string"))


def _check_read_fields(data: dict[str, Any]) -> None:
    for name, kind, said in _READ_FIELDS:
        value = data.get(name)
        if value is not None and type(value) is not kind:
            raise ValidationFailedError(f"{name}: Input should be {said}", field=name)


async def _read_body(request: web.Request) -> tuple[bytes, dict[str, Any]]:
    # The kernel's parser (rlcp.core.body), as every process's. `decode=False`: the body goes to
    # the worker as it came, and the workers' inference servers take identity bodies only, so
    # a Content-Encoding is a 415 here rather than a worker's error (or a body read twice).
    raw = await read_body(request, decode=False)
    data = parse_json(raw) if raw.strip() else None
    if not isinstance(data, dict):
        raise BadRequestError("request body must be a JSON object", field="body")
    check_client_nvext(data)
    _check_read_fields(data)
    return raw, data


def _inference_route(path: str, summary: str) -> Callable[[Handler], Handler]:
    return api.post(path, summary, body=InferenceBody, ok=dict[str, Any], errors=(502, 503), tag=_INFERENCE)


async def proxy_inference(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    raw, body = await _read_body(request)
    return await gateway.forward(request, raw, _policy(request, body, gateway))


for _path, _what in (*vllm_routes.FORWARDED, *vllm_routes.OTHER_ENGINES_FORWARDED):
    _inference_route(_path, f"{_what[0].upper()}{_what[1:]}, on a worker inside the fence.")(proxy_inference)


def _refusal(method: str, path: str, why: str) -> Handler:
    async def refuse(request: web.Request) -> web.StreamResponse:
        raise NotSupportedError(f"{method} {path} is not forwarded by the gateway: {why}", field=path)

    refuse.__name__ = f"refuse_{path.strip('/').replace('/', '_')}"
    return refuse


for _method, _path, _why in vllm_routes.REFUSED:
    api.route(
        _method,
        _path,
        f"Not forwarded: {_why}.",
        errors=(501,),
        tag=_INFERENCE,
        **({"path_params": {"response_id": {"type": "string", "minLength": 1}}} if "{" in _path else {}),
    )(_refusal(_method, _path, _why))


@api.get(
    "/v1/models", "The union of the models and adapters the reachable members serve.", ok=ModelList, tag=_INFERENCE
)
async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    if gateway.fleets is None:
        cards = await request.app[MODELS].cards(gateway.router.state(), gateway.session)
    else:  # every fleet's, each read (and kept) on its own
        cards = merge_cards(
            [await fleet.models.cards(fleet.router.state(), gateway.session) for fleet in gateway.fleets]
        )
    return json_response({"object": "list", "data": cards})


@api.get("/healthz", "Liveness.", ok=ProbeAnswer, probe=True, tag=_PROBES)
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@api.get(
    "/health",
    "What trainers probe on an inference server (vLLM's `/health`): 200 while some member is "
    "inside the fence, else 503 with the reason.",
    ok=ProbeAnswer,
    answers={503: ProbeAnswer},
    probe=True,
    tag=_PROBES,
)
@api.get(
    "/readyz",
    "Ready while some member is inside the fence.",
    ok=ProbeAnswer,
    answers={503: ProbeAnswer},
    probe=True,
    tag=_PROBES,
)
async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    fleets = [(f.name, f.router) for f in gateway.fleets] if gateway.fleets else [("", gateway.router)]
    reasons = []
    for name, router in fleets:
        table = router.table()
        if table is not None and table.routes:
            return json_response({"status": "ready"})
        reason = table.why_empty if table is not None else "no fleet state yet"
        reasons.append(f"fleet {name}: {reason}" if name else reason)
    return json_response({"status": "not_ready", "reason": "; ".join(reasons)}, status=503)


@api.get("/metrics", "Prometheus metrics of the gateway.", ok=str, media_type="text/plain", tag=_PROBES)
async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[GATEWAY].metrics.render(), content_type="text/plain", charset="utf-8")


MODELS = web.AppKey("models", ServedModels)
ROUTES: tuple[Route, ...] = (*api.declared, openapi_route())
DESCRIPTION = (
    "The inference gateway of an RL fleet: the OpenAI and vLLM inference routes of the workers, sent only "
    "to a member inside the weight-version fence. Answers are the worker's, plus `X-RL-Worker` and "
    "`X-RL-Weight-Version`. While nothing can serve, requests are held up to the hold deadline, then "
    "answered 503 with `Retry-After`. Per request: `X-RL-Max-Staleness` (versions before the desired "
    "one that may serve) and `X-RL-Hold-Timeout` (seconds). This port also answers every route of the "
    "controller's API (its own document), authorized by the controller: one URL serves the whole fleet."
)


@built_once
def gateway_document(*, secured: bool) -> dict[str, Any]:
    return build_document(ROUTES, title="rl-controlplane gateway", description=DESCRIPTION, auth_reads=secured)


def build_gateway_app(
    gateway: Gateway, *, peer: Peer | None = None, controller: Fallback | None = None
) -> web.Application:
    """`peer`: the controller's application, in this process; `controller`: how a standalone
    gateway forwards what it does not route (`admin.forward_to_controller`). Neither: a 404."""
    settings = gateway.settings
    token = settings.resolved_token()
    middlewares: list[Any] = [
        make_error_middleware(settings.max_body_bytes),
        make_handover_middleware(fallback=controller),
    ]
    if token:
        middlewares.append(
            make_auth_middleware(
                token, auth_reads=True, open_paths=open_paths(ROUTES), also_accepted=gateway.accepted_admin_tokens()
            )
        )
    app = web.Application(
        client_max_size=settings.max_body_bytes, middlewares=middlewares, handler_args=BODY_HANDLER_ARGS
    )
    app[GATEWAY] = gateway
    app[MODELS] = ServedModels()

    async def close_upstream(_: web.Application) -> None:
        gateway.close()

    app.on_cleanup.append(close_upstream)
    if peer is not None:
        app[PEER] = peer
    api.register(app)
    serve_document(app, functools.partial(gateway_document, secured=bool(token)))
    return app


async def start_site(
    gateway: Gateway, *, peer: Peer | None = None, controller: Fallback | None = None
) -> web.AppRunner:
    """Serve the gateway on its own port; a client that goes away cancels its handler."""
    s = gateway.settings
    app = build_gateway_app(gateway, peer=peer, controller=controller)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, s.host, s.port, backlog=1024, reuse_address=True)
    await site.start()
    port = runner.addresses[0][1]
    gateway.url = f"http://{s.host}:{port}"
    return runner


_IDLE_DEFAULT_S: float = GatewaySettings.model_fields["upstream_idle_timeout_s"].default


def new_session(idle_timeout_s: float = _IDLE_DEFAULT_S) -> aiohttp.ClientSession:
    """The client session of the gateway's own calls (the members' models; a standalone gateway's
    controller, followed and forwarded to): no total deadline (each call carries its own), idle
    connections let go of before the servers close them (`gateway.upstream_idle_timeout_s`).
    Inference goes over the sender's own pool (`upstream.py`)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=idle_timeout_s),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
    )

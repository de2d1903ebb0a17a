"""The front's routes: the state from the replica, its own liveness, the rest proxied.

- `GET /v1/rl/state`: the replica's bytes, with the core's tag, 304 and gzip as the core
  answers them (`rlcp.core.cached`); proxied to the core until the first read arrived. A read
  with a query (`?selector=`) is proxied too: the replica holds the whole document, and the
  selector's parsing (a 422 naming it) and filter are the core's, in one place.
- `GET /healthz`: 200 while the core answered a state read within `stale_s` (a hung core is
  a dead controller, and the probe must not queue behind it to find out).
- the gateway's inference routes (one URL, docs/controller.md): proxied to the core, which
  hands them to its gateway, with the answer streamed back as it comes (server-sent events
  included). The front does not check the admin token on them: the gateway's own token rule
  applies, in the core.
- everything else: proxied to the core as it came (method, path, query, headers, body) and
  answered as the core answered it. A write is followed by a fresh state read before its
  answer goes back. The token is checked here as in the core, so a request
  that would be refused never crosses.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from rlcp.controlplane.api.openapi import ROUTES
from rlcp.controlplane.gateway.app import ROUTES as GATEWAY_ROUTES
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.body import BODY_HANDLER_ARGS
from rlcp.core.cached import cached_response
from rlcp.core.errors import ApiError
from rlcp.core.follow import FollowedDocument
from rlcp.core.http import HOP_BY_HOP, json_response, make_auth_middleware, make_error_middleware
from rlcp.core.openapi import open_paths
from rlcp.core.tracing import outgoing_headers

_OPEN_PATHS = open_paths(ROUTES)
# The gateway's inference routes the controller does not serve itself (`/v1/models` it does).
_INFERENCE = frozenset(r.path for r in GATEWAY_ROUTES if r.tag == "inference") - {r.path for r in ROUTES}
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_HOP_OUT = HOP_BY_HOP | {"date", "server"}  # the answer's Date and Server are this process's


class CoreUnavailable(ApiError, status=503, code="core_unavailable"):
    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": "1"}


class CoreTimeout(ApiError, status=504, code="core_timeout"): ...


class CoreLink:
    """How the front reaches the core: its URL, a session that hands bodies on as they came
    (no decompression), and the deadline of one proxied request."""

    def __init__(self, *, url: str, session: aiohttp.ClientSession, timeout_s: float) -> None:
        self.url, self.session, self.timeout_s = url.rstrip("/"), session, timeout_s


REPLICA = web.AppKey("replica", FollowedDocument)
CORE = web.AppKey("core", CoreLink)


def build_front(
    settings: ControllerSettings, *, token: str, core: CoreLink, replica: FollowedDocument
) -> web.Application:
    app = web.Application(
        # The body is forwarded exactly as it came, Content-Encoding and all: the core decodes it
        # (rlcp.core.body), so the two cannot disagree about what was sent.
        client_max_size=settings.api.max_body_bytes,
        handler_args=BODY_HANDLER_ARGS,
        middlewares=[
            make_error_middleware(settings.api.max_body_bytes),
            inference_middleware,
            make_auth_middleware(
                token,
                auth_reads=settings.api.auth_reads,
                open_paths=_OPEN_PATHS,
                allow_anonymous=settings.api.allow_anonymous,
            ),
        ],
    )
    app[REPLICA], app[CORE] = replica, core
    stale_s = settings.api.front_stale_s

    async def state(request: web.Request) -> web.StreamResponse:
        body = replica.body
        if body is None or request.query_string:
            return await forward(request)
        return cached_response(request, etag=body.etag, body=lambda: body)

    async def healthz(request: web.Request) -> web.Response:
        age = replica.age_s()
        if age is not None and age <= stale_s:
            return json_response({"status": "ok"})
        reason = (
            f"the controller core has not answered a state read for {age:.0f}s"
            if age is not None
            else "the controller core has not answered a state read yet"
        )
        if replica.last_error:
            reason += f" (last error: {replica.last_error})"
        return json_response({"status": "core_unresponsive", "reason": reason}, status=503)

    app.router.add_get("/v1/rl/state", state)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@web.middleware
async def inference_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An inference route goes to the core (and its gateway) past the admin token check."""
    if request.path in _INFERENCE:
        return await stream(request)
    return await handler(request)


def _outgoing(request: web.Request) -> CIMultiDict[str]:
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)
    # The id and trace this front gave the call (its own when the client sent none), so the
    # core's log lines and its worker calls carry the ones the client was answered with.
    for name, value in outgoing_headers().items():
        headers[name] = value
    return headers


async def stream(request: web.Request) -> web.StreamResponse:
    """An inference request, its answer passed on chunk by chunk as the core sends it."""
    core = request.app[CORE]
    data = await request.read()
    what = f"{request.method} {request.path}"
    answer: web.StreamResponse | None = None
    try:
        async with asyncio.timeout(core.timeout_s):
            async with core.session.request(
                request.method,
                core.url + request.path_qs,
                data=data or None,
                headers=_outgoing(request),
                allow_redirects=False,
            ) as resp:
                answer = web.StreamResponse(
                    status=resp.status,
                    headers=CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() not in _HOP_OUT),
                )
                await answer.prepare(request)
                async for chunk in resp.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
                return answer
    except (TimeoutError, aiohttp.ClientError) as exc:
        if answer is not None:  # mid-answer: no status left to send; the cut connection says it
            if request.transport is not None:
                request.transport.close()
            return answer
        if isinstance(exc, aiohttp.ClientError):
            raise CoreUnavailable(f"the controller core did not answer {what}: {type(exc).__name__}: {exc}") from exc
        raise CoreTimeout(f"the controller core did not answer {what} within {core.timeout_s:g}s") from exc


async def forward(request: web.Request) -> web.Response:
    core, replica = request.app[CORE], request.app[REPLICA]
    data = await request.read()
    headers = _outgoing(request)
    what = f"{request.method} {request.path}"
    try:
        async with asyncio.timeout(core.timeout_s):
            async with core.session.request(
                request.method, core.url + request.path_qs, data=data or None, headers=headers, allow_redirects=False
            ) as resp:
                payload = await resp.read()
    except TimeoutError as exc:
        raise CoreTimeout(f"the controller core did not answer {what} within {core.timeout_s:g}s") from exc
    except aiohttp.ClientError as exc:
        raise CoreUnavailable(f"the controller core did not answer {what}: {type(exc).__name__}: {exc}") from exc
    answer: Any = CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() not in _HOP_OUT)
    if request.method in _WRITES:
        await replica.refresh()  # the write's effects are in the state before its answer goes back
    return web.Response(status=resp.status, body=payload, headers=answer)

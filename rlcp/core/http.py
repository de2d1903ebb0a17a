"""HTTP edges of the admin port: the error middleware, the token check, body parsing.

Every failure leaves through `error_middleware` as `{"error": {"code", "message",
"field"?}}` with a 4xx/5xx status; handlers raise, they do not build error responses.
"""

from __future__ import annotations

import base64
import contextvars
import hmac
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel, ValidationError

from rlcp.core import tracing
from rlcp.core.body import read_json_object
from rlcp.core.errors import ApiError, UnauthorizedError, ValidationFailedError

log = structlog.get_logger("rlcp.core.http")
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# structlog's own context variables for the keys every call binds, taken once through its public API
# (the tokens `bind_contextvars` returns name their variables), bound in a throwaway context. Setting
# and resetting them is what `bind_contextvars` and `reset_contextvars` do, without building and
# prefixing the keys per call (those were ~2% of the gateway's CPU per proxied request).
_REQUEST_ID_VAR, _TRACE_ID_VAR, _ROUTE_VAR = (
    token.var
    for token in contextvars.copy_context()
    .run(structlog.contextvars.bind_contextvars, request_id=None, trace_id=None, route=None)
    .values()
)
# Not forwarded by a proxy, either way: the hop-by-hop headers (RFC 9110 §7.6.1), plus what the
# client library sets itself for the next hop (Host, Content-Length). The front and the gateway.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def json_response(data: Any, status: int = 200) -> web.Response:
    if isinstance(data, BaseModel):
        return web.Response(text=data.model_dump_json(), status=status, content_type="application/json")
    return web.json_response(data, status=status)


def error_response(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers)


Translate = Callable[[Exception], ApiError | None]


def make_error_middleware(max_body: int, *, translate: Translate | None = None) -> Middleware:
    """`translate` maps a process's own domain errors to `ApiError`s (None: not one of them),
    so domain code raises what went wrong and only this edge knows the HTTP status."""

    @web.middleware
    async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # The call's request id and trace (`rlcp.core.tracing`): on every log line of the call, on
        # every call it causes to another process, and echoed on the answer.
        call = tracing.from_headers(request.headers)
        # Bound and reset by token rather than two context managers: this runs for every request
        # of every process, the gateway's hot path included.
        traced = tracing.bind(call)
        logged = (
            _REQUEST_ID_VAR.set(call.request_id),
            _TRACE_ID_VAR.set(call.trace_id),
            _ROUTE_VAR.set(request.path),
        )
        try:
            response = await _answer(request, handler)
        finally:
            _ROUTE_VAR.reset(logged[2])
            _TRACE_ID_VAR.reset(logged[1])
            _REQUEST_ID_VAR.reset(logged[0])
            tracing.unbind(traced)
        if not response.prepared:  # a stream's headers are gone already (and carried it, via the handler)
            response.headers[tracing.REQUEST_ID_HEADER] = call.request_id
        return response

    async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            try:
                return await handler(request)
            except Exception as exc:
                mapped = translate(exc) if translate is not None else None
                if mapped is None:
                    raise
                raise mapped from exc
        except ApiError as exc:
            if exc.status >= 500:
                log.warning("request_failed", status=exc.status, code=exc.code, error=exc.message)
            return error_response(exc)
        except web.HTTPRequestEntityTooLarge:
            return _too_large(max_body)
        except web.HTTPException as exc:
            return _aiohttp_error(request, exc)
        except Exception as exc:
            log.exception("unhandled_error")
            return web.json_response(
                {"error": {"code": "internal", "message": f"{type(exc).__name__}: {exc}"}}, status=500
            )

    return error_middleware


def _too_large(max_body: int) -> web.Response:
    message = f"request body is larger than {max_body} bytes"
    return web.json_response({"error": {"code": "payload_too_large", "field": "body", "message": message}}, status=413)


def _aiohttp_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's own 404/405: keep the status (and a 405's `Allow`, RFC 9110), use our error shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
    allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    # Naming the path: a trainer's base URL off by a segment shows in the answer itself.
    said = f"{exc.reason}: {request.method} {request.path}" if exc.status in (404, 405) else exc.reason
    return web.json_response({"error": {"code": code, "message": said}}, status=exc.status, headers=allow)


def _presented_token(header: str) -> bytes | None:
    """`Bearer <token>`, or HTTP Basic with the token as the password (any user name):
    clients that cannot set a header (vLLM's HTTP weight-sync client) can still send a
    token through `~/.netrc`, as registries and Git hosts accept."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.encode()
    if scheme.lower() == "basic" and value:
        try:
            _, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return password.encode() if sep and password else None
    return None


def presents_one_of(header: str, tokens: Collection[str]) -> bool:
    """Whether an `Authorization` value carries one of these tokens. Every token is
    compared, each in constant time, so a timing tells neither a token nor which matched."""
    given = _presented_token(header)
    if given is None:
        return False
    matches = [hmac.compare_digest(given, t.encode()) for t in tokens]
    return any(matches)


def make_auth_middleware(
    token: str,
    *,
    auth_reads: bool,
    open_paths: frozenset[str],
    also_accepted: Collection[str] = (),
    allow_anonymous: bool = False,
) -> Middleware:
    """`also_accepted`: further tokens that pass (the gateway takes the controller's admin
    token too, so a trainer's one API key serves both its inference and admin URLs).
    `allow_anonymous`: a request with no `Authorization` header passes (the controller's
    `api.allow_anonymous`, for clients with no token option); one that presents a token
    still needs the right one."""
    tokens = (token, *also_accepted)

    @web.middleware
    async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.http_exception is not None:
            # No such route or method: the 404/405 (with `Allow`) says so, token or not; what
            # the API serves is public anyway (GET /openapi.json).
            return await handler(request)
        needs_token = request.method in _MUTATING or (auth_reads and request.path not in open_paths)
        if needs_token:
            header = request.headers.get("Authorization", "")
            if not header and allow_anonymous:
                return await handler(request)
            if not presents_one_of(header, tokens):
                raise UnauthorizedError(
                    "missing or wrong bearer token" if header else "missing bearer token", field="Authorization"
                )
        return await handler(request)

    return auth_middleware


async def parse_body(request: web.Request, model: type[M], *, allow_empty: bool = False) -> M:
    """Parse a JSON object body into `model`: 400 for bad JSON, 422 naming the field."""
    return validate(model, await read_object(request, allow_empty=allow_empty), strict=True)


async def read_object(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object, or a 4xx naming `body` (or `Content-Encoding`): the kernel's
    one body parser (`rlcp.core.body`), so every process refuses the same inputs the same way."""
    return await read_json_object(request, allow_empty=allow_empty)


def validate(model: type[M], data: dict[str, Any], *, strict: bool = False) -> M:
    """`strict` for JSON bodies: JSON has types, so `"verify": "no"` or `"timeout_s": true` is a
    422 rather than a quiet False or 1.0. Query strings are text and are read lax (`?timeout_s=5`)."""
    try:
        return model.model_validate(data, strict=strict)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise ValidationFailedError(f"{field}: {first['msg']}", field=field) from exc

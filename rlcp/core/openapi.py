"""OpenAPI 3.1 documents of the agent's admin API and the controller's API, from the wire models.

Each route is declared once, on its handler (`RouteTable`: method, path, request body, query,
answers per status, whether it is a probe), or as an entry that names the function it runs
(`RouteTable.serve`: one generic handler reads what the entry declares and hands it on): the app
registers the handlers from those declarations and `build_document` turns the same declarations
into the document served at `GET /openapi.json`. `route_drift` still compares the document with what an aiohttp app
registered, so a route added beside the table (or a declaration without a handler) fails
the tests instead of drifting. Schemas come from the pydantic models themselves
(`TypeAdapter.json_schemas`, one pass, so two models of one name get distinct names), and
the JSON Schema dialect of OpenAPI 3.1 is pydantic's own (draft 2020-12).

Which routes need the token follows the auth middleware (`rlcp.core.http`): every
mutating method; reads too when `auth_reads` is on, except the probes and this document.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from importlib import metadata
from typing import Any, ParamSpec

from aiohttp import web
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from rlcp.core.body import read_json_object
from rlcp.core.errors import ErrorBody
from rlcp.core.http import json_response, parse_body, validate

P = ParamSpec("P")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# What a served entry runs: on the table's context of the request (the controller, the agent's
# service), with what the route reads; its value is the answer.
Run = Callable[[Any, Any], Awaitable[Any]]
OPENAPI_PATH = "/openapi.json"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
try:  # every document's `info.version`: the installed package's
    API_VERSION = metadata.version("rl-controlplane")
except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    API_VERSION = "0+unknown"
_REF = "#/components/schemas/{model}"
_PARAM = re.compile(r"{(\w+)}")

SECURITY_SCHEMES = {
    "bearerAuth": {
        "type": "http",
        "scheme": "bearer",
        "description": "`Authorization: Bearer <token>`; compared in constant time.",
    },
    "basicAuth": {
        "type": "http",
        "scheme": "basic",
        "description": "HTTP Basic with the token as the password (any user name), for clients that "
        "cannot set a header (vLLM's HTTP weight-sync client, through `~/.netrc`).",
    },
}
_SECURED: list[dict[str, list[str]]] = [{"bearerAuth": []}, {"basicAuth": []}]


@dataclass(frozen=True)
class Route:
    """One route as clients see it. Statuses answered with the error shape are `errors`, plus
    those implied: 401 where the token is needed, 400/413/415/422 with a body, 422 with a query,
    404 with a path parameter."""

    method: str
    path: str
    summary: str
    ok: Any = None  # the 200 answer's type; None: no JSON body
    body: Any = None  # the request body's type (a model, or a union of models)
    body_optional: bool = False  # an empty body reads as `{}`
    query: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    answers: Mapping[int, Any] = field(default_factory=dict)  # other statuses with a shape of their own
    media_type: str = "application/json"  # of the 200 answer
    probe: bool = False  # open even with auth_reads (liveness, readiness, this document)
    path_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # name -> JSON schema
    tag: str | None = None
    handler: Handler | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.method, self.path

    def needs_token(self, *, auth_reads: bool) -> bool:
        return self.method in MUTATING or (auth_reads and not self.probe)

    async def read_input(self, request: web.Request) -> Any:
        """What the route declares it reads: its body model (an empty body read as `{}` when
        optional; 400 for bad JSON, 422 naming the field), else its query model (422 naming the
        field), else nothing (None)."""
        if self.body is not None:
            return await parse_body(request, self.body, allow_empty=self.body_optional)
        if self.query is not None:
            return validate(self.query, dict(request.query))
        return None


def open_paths(routes: Iterable[Route]) -> frozenset[str]:
    """The paths the auth middleware (`rlcp.core.http`) lets through without the token even with
    `auth_reads`: the probes and this document."""
    return frozenset(r.path for r in routes if r.probe)


def openapi_route(summary: str = "This document.") -> Route:
    return Route("GET", OPENAPI_PATH, summary, ok=dict[str, Any], probe=True, tag="meta")


def _request(request: web.Request) -> web.Request:
    return request


class RouteTable:
    """An API's routes, each declared once on its handler:

        api = RouteTable()

        @api.post("/pause", "Pause generation.", query=PauseQuery, ok=StatusAnswer)
        async def pause(request): ...

    `register` adds the handlers to an app; `declared` (plus the document route) is what
    `build_document` describes. A handler may carry several declarations (two paths). `tag`
    is the document's tag of every route the table declares without one (a route group's);
    `context`, what the entries' functions (`serve`) act on: the app's controller or service.

    A mutating route declared without a body model (vLLM's `/sleep?level=`, `/pause?mode=`)
    still reads its body before its handler runs: empty or a JSON object (which it ignores,
    as vLLM does), else a 400 naming `body`, so a malformed body never acts. `json_bodies=False`
    is for a table whose body-less routes take other bodies (the gateway's refusals of
    multipart audio routes)."""

    def __init__(
        self, *, json_bodies: bool = True, tag: str | None = None, context: Callable[[web.Request], Any] = _request
    ) -> None:
        self._routes: list[Route] = []
        self._json_bodies = json_bodies
        self._tag = tag
        self._context = context

    def route(self, method: str, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        def declare(handler: Handler) -> Handler:
            self._routes.append(self._declare(method, path, summary, handler=handler, **kw))
            return handler

        return declare

    def serve(
        self,
        method: str,
        path: str,
        summary: str,
        run: Run,
        *,
        respond: Callable[[Any], web.StreamResponse] = json_response,
        **kw: Any,
    ) -> None:
        """Declare a route as data, an entry naming the function it runs: one generic handler reads
        what the declaration says the route takes (`Route.read_input`), runs `run(on, input)` (`on`:
        the table's `context` of the request, the object its routes act on) and answers what it
        returns (as JSON, or `respond`)."""
        route = self._declare(method, path, summary, **kw)
        context = self._context

        async def handler(request: web.Request) -> web.StreamResponse:
            given = await route.read_input(request)
            return respond(await run(context(request), given))

        self._routes.append(replace(route, handler=handler))

    def _declare(self, method: str, path: str, summary: str, **kw: Any) -> Route:
        return Route(method, path, summary, **{"tag": self._tag, **kw})

    def get(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("GET", path, summary, **kw)

    def post(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("POST", path, summary, **kw)

    def put(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("PUT", path, summary, **kw)

    def delete(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("DELETE", path, summary, **kw)

    def include(self, *tables: RouteTable) -> None:
        """Append other tables' routes, in order: an API declared in one table per route group
        (as FastAPI's `include_router`) is registered and documented in the order included."""
        for table in tables:
            self._routes.extend(table._routes)

    @property
    def declared(self) -> tuple[Route, ...]:
        return tuple(self._routes)

    def register(self, app: web.Application) -> None:
        for route in self._routes:
            assert route.handler is not None
            if route.method == "GET":
                app.router.add_get(route.path, route.handler)  # HEAD comes with it, as RouteTableDef does
            elif route.body is None and self._json_bodies:
                app.router.add_route(route.method, route.path, _body_checked(route.handler))
            else:
                app.router.add_route(route.method, route.path, route.handler)


def _body_checked(handler: Handler) -> Handler:
    """`handler`, once the body it ignores is known to be absent or a JSON object (the kernel's
    one parser, `rlcp.core.body`: every malformed body is refused the same way everywhere)."""

    @functools.wraps(handler)
    async def checked(request: web.Request) -> web.StreamResponse:
        if request.body_exists:
            await read_json_object(request, allow_empty=True)
        return await handler(request)

    return checked


def build_document(
    routes: Iterable[Route], *, title: str, description: str, auth_reads: bool, version: str = API_VERSION
) -> dict[str, Any]:
    routes = list(routes)
    keys = [r.key for r in routes]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a route is declared twice: {sorted(k for k in keys if keys.count(k) > 1)}")
    schemas, defs = _schemas(routes)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, schemas, defs, auth_reads=auth_reads)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "components": {"schemas": dict(sorted(defs.items())), "securitySchemes": SECURITY_SCHEMES},
    }


def built_once(build: Callable[P, dict[str, Any]]) -> Callable[P, dict[str, Any]]:
    """`build` (a document function: a pure function of the route declarations and its
    arguments) run once per arguments in a process, each call answered with a fresh copy the
    caller may change. Every app serves its document, and each built it again with the app:
    pydantic's schema generation costs 30 ms (the agent's) to 60 ms (the controller's) a build, a
    third of the CPU of the test processes that start controllers and agents in-process by the
    hundred (apps now build theirs at its first request, `serve_document`)."""
    encoded: dict[tuple[Any, ...], str] = {}

    @functools.wraps(build)
    def document(*args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in encoded:
            encoded[key] = json.dumps(build(*args, **kwargs))
        return dict(json.loads(encoded[key]))

    return document


def route_drift(app: web.Application, routes: Iterable[Route]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(registered but not declared, declared but not registered); HEAD comes with each GET."""
    registered = {
        (r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None and r.method != "HEAD"
    }
    declared = {r.key for r in routes}
    return registered - declared, declared - registered


def serve_document(app: web.Application, document: Callable[[], Mapping[str, Any]]) -> None:
    """Register `GET /openapi.json`; the document is built and encoded at its first request (most
    apps are never asked for it; the tests hold every document to the routes, `route_drift`)."""
    body = functools.cache(lambda: web.json_response(document()).body)

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=body(), content_type="application/json")

    app.router.add_get(OPENAPI_PATH, openapi)


# -- building ------------------------------------------------------------------------------
_SchemaKey = tuple[str, JsonSchemaMode, Any]  # (role, mode, the type a route names)


def _schemas(routes: list[Route]) -> tuple[dict[_SchemaKey, dict[str, Any]], dict[str, Any]]:
    """One schema pass over every type the routes use: requests in validation mode,
    answers in serialization mode. Returns {(role, mode, type) -> schema} and the $defs."""
    wanted: dict[_SchemaKey, TypeAdapter[Any]] = {}

    def want(role: str, mode: JsonSchemaMode, tp: Any) -> None:
        key = (role, mode, tp)
        if tp is not None and key not in wanted:
            wanted[key] = TypeAdapter(tp)

    want("answer", "serialization", ErrorBody)
    for r in routes:
        want("body", "validation", r.body)
        want("query", "validation", r.query)
        want("answer", "serialization", r.ok)
        for tp in r.answers.values():
            want("answer", "serialization", tp)
    out, top = TypeAdapter.json_schemas([((k, k[1]), k[1], ta) for k, ta in wanted.items()], ref_template=_REF)
    return {k: out[((k, k[1]), k[1])] for k in wanted}, top.get("$defs", {})


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else schema


def _query_parameters(model_schema: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A query model's fields as `in: query` parameters. A query value is a string or absent,
    never null, so the null branch of an optional field is dropped."""
    required = set(model_schema.get("required", ()))
    params = []
    for name, prop in model_schema.get("properties", {}).items():
        prop = dict(prop)
        description = prop.pop("description", None)
        prop.pop("title", None)
        branches = prop.pop("anyOf", None)
        if branches is not None:
            rest = [b for b in branches if b != {"type": "null"}]
            prop = {**(rest[0] if len(rest) == 1 else {"anyOf": rest}), **prop}
            if prop.get("default", 0) is None:
                del prop["default"]
        param = {"name": name, "in": "query", "required": name in required, "schema": prop}
        if description:
            param["description"] = description
        params.append(param)
    return params


def _error(status: int, schema: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "description": HTTPStatus(status).phrase + " (the error shape)",
        "content": {"application/json": {"schema": dict(schema)}},
    }


def _operation(
    route: Route, schemas: Mapping[_SchemaKey, dict[str, Any]], defs: Mapping[str, Any], *, auth_reads: bool
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": route.method.lower() + re.sub(r"\W+", "_", route.path).rstrip("_"),
    }
    if route.tag:
        op["tags"] = [route.tag]
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": dict(route.path_params.get(name, {"type": "string"}))}
        for name in _PARAM.findall(route.path)
    ]
    errors = set(route.errors)
    if route.query is not None:
        params += _query_parameters(_resolve(schemas[("query", "validation", route.query)], defs))
        errors.add(422)
    if params:
        op["parameters"] = params
    if any(p["in"] == "path" for p in params):
        errors.add(404)
    if route.body is not None:
        op["requestBody"] = {
            "required": not route.body_optional,
            "content": {"application/json": {"schema": schemas[("body", "validation", route.body)]}},
        }
        errors |= {400, 413, 415, 422}
    secured = route.needs_token(auth_reads=auth_reads)
    if secured:
        op["security"] = _SECURED
        errors.add(401)
    responses: dict[str, Any] = {}
    ok: dict[str, Any] = {"description": "OK"}
    if route.ok is not None:
        schema = (
            {"type": "string"}
            if route.media_type != "application/json"
            else schemas[("answer", "serialization", route.ok)]
        )
        ok["content"] = {route.media_type: {"schema": schema}}
    responses["200"] = ok
    for status, tp in route.answers.items():
        answer: dict[str, Any] = {"description": HTTPStatus(status).phrase}
        if tp is not None:
            answer["content"] = {"application/json": {"schema": schemas[("answer", "serialization", tp)]}}
        responses[str(status)] = answer
    for status in sorted(errors - set(route.answers)):
        responses[str(status)] = _error(status, schemas[("answer", "serialization", ErrorBody)])
    op["responses"] = dict(sorted(responses.items()))
    return op

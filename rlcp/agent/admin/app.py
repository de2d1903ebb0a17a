"""The admin app factory: routes, middlewares, limits, and the OpenAPI document."""

from __future__ import annotations

import functools

from aiohttp import web

from rlcp.agent.admin import extras, probes, routes
from rlcp.agent.admin.handling import SERVICE
from rlcp.agent.admin.openapi import ROUTES, agent_document
from rlcp.agent.service import AgentService
from rlcp.core.body import BODY_HANDLER_ARGS
from rlcp.core.http import make_auth_middleware, make_error_middleware
from rlcp.core.openapi import open_paths, serve_document

# Probes (and the API document) must work without the token even when reads are protected.
_OPEN_PATHS = open_paths(ROUTES)


def build_admin_app(service: AgentService, *, token: str) -> web.Application:
    settings = service.settings.admin
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        handler_args=BODY_HANDLER_ARGS,
        middlewares=[
            make_error_middleware(settings.max_body_bytes),
            make_auth_middleware(token, auth_reads=settings.auth_reads, open_paths=_OPEN_PATHS),
        ],
    )
    app[SERVICE] = service
    for table in (routes.api, extras.api, probes.api):
        table.register(app)
    serve_document(app, functools.partial(agent_document, auth_reads=settings.auth_reads))
    return app

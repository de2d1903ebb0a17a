"""The agent admin API's OpenAPI document, served at `GET /openapi.json`.

The routes are declared on their handlers (the `api` of `routes`, `extras` and `probes`); `ROUTES` is those
declarations plus the document's own route, the list the document is built from and the
tests hold the registered routes to (`rlcp.core.openapi.route_drift`).
"""

from __future__ import annotations

from typing import Any

from rlcp.agent.admin import extras, probes, routes
from rlcp.core.openapi import Route, build_document, built_once, openapi_route

ROUTES: tuple[Route, ...] = (*routes.api.declared, *extras.api.declared, *probes.api.declared, openapi_route())

DESCRIPTION = (
    "The admin port of one agent (one vLLM engine). The root routes take and answer what vLLM's RL "
    'routes do; `/v1/agent/*` are this project\'s extras. Errors are `{"error": {"code", "message", '
    '"field"?}}`. Mutating routes need the token (Bearer, or Basic with the token as the password); '
    "with `admin.auth_reads` reads do too, except `/healthz`, `/readyz` and this document."
)


@built_once
def agent_document(*, auth_reads: bool) -> dict[str, Any]:
    return build_document(ROUTES, title="rl-agent admin API", description=DESCRIPTION, auth_reads=auth_reads)

"""The controller API's OpenAPI document: the native routes and probes (`routes.py`), this
document, and the compatibility facade at the root (`facade.py`), each declared once on its
handler. The tests hold the registered routes to it (`rlcp.core.openapi.route_drift`).
"""

from __future__ import annotations

from typing import Any

from rlcp.controlplane.api import facade, routes, unsupported
from rlcp.core.openapi import Route, build_document, openapi_route

ROUTES: tuple[Route, ...] = (*routes.api.declared, openapi_route(), *facade.api.declared,
                             *unsupported.api.declared)

DESCRIPTION = ("The fleet controller. `/v1/rl/*` is the native API; the root is shaped like one vLLM server "
               "(its RL routes, and the disk and LoRA routes RL frameworks call), driving the whole fleet; its admin routes "
               "that have no fleet meaning answer 501 `not_supported` saying why. Errors "
               "are `{\"error\": {\"code\", \"message\", \"field\"?}}`; bad input is answered before any worker is "
               "called. Mutating routes need the token (Bearer, or Basic with the token as the password); with "
               "`api.auth_reads` reads do too, except `/healthz`, `/readyz`, `/health` and this document.")


def controller_document(*, auth_reads: bool) -> dict[str, Any]:
    return build_document(ROUTES, title="rl-controlplane API", description=DESCRIPTION,
                          auth_reads=auth_reads)

"""The controller API's OpenAPI document: the native routes and probes (`routes/`), this
document, and the compatibility facade at the root (`facade.py`), each declared once on its
handler. The tests hold the registered routes to it (`rlcp.core.openapi.route_drift`).
"""

from __future__ import annotations

from typing import Any

from rlcp.controlplane.api import facade, facade_info, facade_rpc, fleets, routes, unsupported
from rlcp.core.openapi import Route, build_document, built_once, openapi_route

# What each fleet serves (the default one at the root, a named one under /fleets/<name>/), and
# the root's whole set: those plus the list of fleets.
FLEET_ROUTES: tuple[Route, ...] = (
    *routes.api.declared,
    openapi_route(),
    *facade.api.declared,
    *facade_rpc.api.declared,
    *facade_info.api.declared,
    *unsupported.api.declared,
)
ROUTES: tuple[Route, ...] = (*FLEET_ROUTES, *fleets.api.declared)

DESCRIPTION = (
    "The fleet controller. `/v1/rl/*` is the native API; the root is shaped like one vLLM server "
    "(its RL routes, and the disk and LoRA routes RL frameworks call), driving the whole fleet; its admin routes "
    "that have no fleet meaning answer 501 `not_supported` saying why. Errors "
    'are `{"error": {"code", "message", "field"?}}`; bad input is answered before any worker is '
    "called. Mutating routes need the token (Bearer, or Basic with the token as the password); with "
    "`api.auth_reads` reads do too, except `/healthz`, `/readyz`, `/health` and this document. "
    "With the gateway in the controller's process, this port also answers the gateway's inference routes "
    "(the gateway's own document), through the weight-version fence: one URL serves the whole fleet."
)


@built_once
def controller_document(*, auth_reads: bool, fleet: str | None = None) -> dict[str, Any]:
    """The root's document, or (`fleet`) the one a named fleet serves under its path."""
    if fleet is None:
        return build_document(ROUTES, title="rl-controlplane API", description=DESCRIPTION, auth_reads=auth_reads)
    document = build_document(
        FLEET_ROUTES,
        title=f"rl-controlplane API: fleet {fleet}",
        description=f"Fleet {fleet!r}: the controller's API for its members alone, under "
        f"`/fleets/{fleet}`. " + DESCRIPTION,
        auth_reads=auth_reads,
    )
    document["servers"] = [{"url": f"/fleets/{fleet}"}]  # the paths above are relative to it
    return document

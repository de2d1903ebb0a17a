"""The controller's native HTTP API (docs/controller.md, "API") and its probes, one module per
route group (as vLLM keeps an `api_router.py` per concern), each route declared once on its
handler (the OpenAPI document is built from the same declarations):

    state       the fleet state, the members, the operations log      state.py
    pause       pause, resume                                         pause.py
    sleep       sleep, wake_up, prefix-cache reset                    sleep.py
    updates     the disk weight update                                updates.py
    lora        adapters                                              lora.py
    engine      the guarded engine passthrough                        engine.py
    transfer    broadcast updates (`/v1/rl/weight_transfer/*`)        transfer.py
    gateway     the gateway's staleness bound                         gateway.py
    placement   Ray placement                                         placement.py
    probes      /healthz, /readyz, /metrics                           probes.py

Handlers parse, call an operation, and shape the answer; errors leave through the shared
middleware as JSON. What the groups share (app keys, how an operation route is declared and
answered) is `api/handling.py`. `api` is every group's table in this order, the order the
routes are registered and documented in.
"""

from __future__ import annotations

from rlcp.controlplane.api.routes import (
    engine,
    gateway,
    lora,
    pause,
    placement,
    probes,
    sleep,
    state,
    transfer,
    updates,
)
from rlcp.core.openapi import RouteTable

api = RouteTable()
api.include(
    state.api,
    pause.api,
    sleep.api,
    updates.api,
    lora.api,
    engine.api,
    transfer.api,
    gateway.api,
    placement.api,
    probes.api,
)

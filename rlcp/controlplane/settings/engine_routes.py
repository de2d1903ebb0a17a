"""The `engine_routes` section: which engine routes the guarded passthrough
(`POST /v1/rl/engine/{route}`, `operations/engine.py`) runs, per flavor.

The default policy lives here, beside the field whose default it is: a flavor an operator leaves
out of `allow` keeps it, so the section merges it in when it is read, and nothing else reads it.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from rlcp.controlplane.workerspec import Flavor
from rlcp.core.settings import Section

EngineMethod = Literal["GET", "POST"]
ENGINE_ROUTE_PATTERN = r"^[A-Za-z0-9_]{1,64}$"  # one path segment: no '/', no '..'
# Engine routes that give a worker a served model name (an adapter): never passed through, since
# the name would skip the check that no other fleet serves it (`POST /v1/rl/loras` makes it).
NAMING_ENGINE_ROUTES = frozenset({"load_lora_adapter", "load_lora"})
# The passthrough's defaults (`POST /v1/rl/engine/{route}`, docs/controller.md): routes each engine
# serves whose effects the controller either does not track or re-reads after the call. Left out on
# purpose: sleep / wake_up / release_kv_cache_memory (a slept engine is one the controller would
# still count as serving: a fleet operation of its own), collective_rpc (arbitrary code), and every
# route an operation already drives (pause, weights, LoRA), which must go through the operation.
DEFAULT_ENGINE_ROUTES: dict[Flavor, dict[str, EngineMethod]] = {
    "agent": {"is_paused": "GET", "weight_info": "GET", "get_world_size": "GET", "abort_requests": "POST"},
    "vllm": {
        "is_paused": "GET",
        "get_world_size": "GET",
        "server_info": "GET",
        "is_sleeping": "GET",
        "reset_prefix_cache": "POST",
        "reset_mm_cache": "POST",
        "reset_encoder_cache": "POST",
    },
    "dynamo": {},
}


class EngineRouteSettings(Section):
    """The guarded engine passthrough: which engine routes an operator may run through the controller."""

    allow: dict[Flavor, dict[str, EngineMethod]] = Field(
        default_factory=lambda: {f: dict(r) for f, r in DEFAULT_ENGINE_ROUTES.items()},
        description="Per flavor, route name -> HTTP method. A flavor left out keeps its defaults; an empty "
        "object allows nothing for it. Route names are one path segment (letters, digits, '_').",
    )

    @model_validator(mode="after")
    def _check(self) -> EngineRouteSettings:
        for flavor, routes in self.allow.items():
            for route in routes:
                if not re.match(ENGINE_ROUTE_PATTERN, route):
                    raise ValueError(
                        f"engine_routes.allow.{flavor}: route {route!r} is not one path segment of "
                        "letters, digits and '_'"
                    )
                if route in NAMING_ENGINE_ROUTES:
                    raise ValueError(
                        f"engine_routes.allow.{flavor}: route {route!r} loads an adapter, whose name "
                        "the gateway routes by: load it with POST /v1/rl/loras, which refuses a name "
                        "another fleet serves"
                    )
        self.allow = {**{f: dict(r) for f, r in DEFAULT_ENGINE_ROUTES.items()}, **self.allow}
        return self

"""Picks the AdminAPI flavor for a worker, by `WorkerSpec.flavor`.

A registry of import paths, imported on first use, so a flavor's module (and anything
it pulls in) loads only in a controller that has such a worker; an unknown flavor names
the registered ones, as vLLM's `WeightTransferEngineFactory` does.
"""

from __future__ import annotations

import importlib
from typing import Any

from controlplane.adminapi.base import AdminAPI
from controlplane.adminapi.http import WorkerHTTP
from controlplane.workers import WorkerSpec

# flavor -> (module, class)
_REGISTRY: dict[str, tuple[str, str]] = {
    "agent": ("controlplane.adminapi.agent", "AgentAdminAPI"),
    "vllm": ("controlplane.adminapi.vllm", "VllmAdminAPI"),
    "dynamo": ("controlplane.adminapi.dynamo", "DynamoAdminAPI"),
}


def make_admin_api(spec: WorkerSpec, http: WorkerHTTP, **options: Any) -> AdminAPI:
    """The AdminAPI for `spec`; `options` (e.g. `weight_load_timeout_s`) go to its constructor."""
    try:
        module_name, class_name = _REGISTRY[spec.flavor]
    except KeyError:
        raise ValueError(f"unknown worker flavor {spec.flavor!r} for worker {spec.id!r}; "
                         f"available: {sorted(_REGISTRY)}") from None
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(spec=spec, http=http, **options)

"""Picks the driver for a worker, by `WorkerSpec.flavor`.

A registry of import paths, imported on first use, so a flavor's module (and anything
it pulls in) loads only in a controller that has such a worker; an unknown flavor names
the registered ones, as vLLM's `WeightTransferEngineFactory` does.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.workers.capabilities import Driver
from rlcp.controlplane.workers.transport import WorkerTransport
from rlcp.controlplane.workerspec import WorkerSpec

# flavor -> (module, class)
_REGISTRY: dict[str, tuple[str, str]] = {
    "agent": ("rlcp.controlplane.workers.flavors.agent", "AgentDriver"),
    "vllm": ("rlcp.controlplane.workers.flavors.vllm", "VllmDriver"),
    "dynamo": ("rlcp.controlplane.workers.flavors.dynamo", "DynamoDriver"),
}


def make_driver(spec: WorkerSpec, transport: WorkerTransport, deadlines: DriverDeadlines) -> Driver:
    try:
        module_name, class_name = _REGISTRY[spec.flavor]
    except KeyError:
        raise ValueError(f"unknown worker flavor {spec.flavor!r} for worker {spec.id!r}; "
                         f"available: {sorted(_REGISTRY)}") from None
    flavor: Callable[..., Driver] = getattr(importlib.import_module(module_name), class_name)
    return flavor(spec=spec, transport=transport, deadlines=deadlines)

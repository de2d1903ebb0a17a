"""Picks the driver for a worker, by `WorkerSpec.flavor`, and reads a flavor's facts off its class.

The flavors are registered by import path (`workerspec.FLAVOR_DRIVERS`), imported on first use,
so a flavor's module (and anything it pulls in) loads only in a process that meets such a
worker; an unknown flavor names the registered ones, as vLLM's `WeightTransferEngineFactory` does.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import cast

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.workers.capabilities import Driver
from rlcp.controlplane.workers.flavors.base import DriverBase
from rlcp.controlplane.workers.transport import WorkerTransport
from rlcp.controlplane.workerspec import FLAVOR_DRIVERS, WorkerSpec


@cache
def driver_class(flavor: str) -> type[DriverBase]:
    """The class of `flavor`'s driver: its facts are class attributes (`DriverBase`)."""
    try:
        module_name, _, class_name = FLAVOR_DRIVERS[flavor].partition(":")
    except KeyError:
        raise ValueError(f"unknown worker flavor {flavor!r}; available: {sorted(FLAVOR_DRIVERS)}") from None
    found: type[DriverBase] = getattr(importlib.import_module(module_name), class_name)
    if found.flavor != flavor:
        raise TypeError(f"{module_name}.{class_name} says it is flavor {found.flavor!r}, registered as {flavor!r}")
    return found


def make_driver(spec: WorkerSpec, transport: WorkerTransport, deadlines: DriverDeadlines) -> Driver:
    try:
        flavor = driver_class(spec.flavor)
    except ValueError as exc:
        raise ValueError(f"{exc} (worker {spec.id!r})") from None
    # Every registered class is a Driver (a status read besides DriverBase's facts); the registration
    # names a class by string, so the type checker cannot follow it there.
    return cast(Driver, flavor(spec=spec, transport=transport, deadlines=deadlines))

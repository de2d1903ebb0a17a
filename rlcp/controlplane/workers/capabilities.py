"""What a worker driver can do, as small structural Protocols, one per capability.

    Driver              every flavor: its spec, and a status read
    ├── Control         pause (abort | wait | keep) and resume
    ├── DiskWeights     reload weights from a directory, naming the version
    ├── Checksums       per-parameter weight checksums (verification beyond versions)
    ├── DesiredVersion  told the fleet's desired version, gates its own readiness on it
    ├── StagedUpdate    a checked disk update: the checkpoint checked on the worker, then
    │                   three calls, each answering what would be a read
    ├── Lora            load / hot-swap and unload adapters
    └── BroadcastPeer   vLLM's weight-transfer protocol (init, start, chunks, finish, ...)

A flavor implements the capabilities its engine has and no others: there is no method whose
only body is "not supported". Operations ask `capabilities(driver)` (or `lacking`) before
touching any worker, so an operation a member cannot do is refused up front, naming the
worker and what it lacks.

Where a worker publishes its route list (Dynamo's listing `routes`, kept in
`WorkerSpec.routes`), a driver that implements `PublishesRoutes` narrows its capabilities to
what the list allows; without a list the flavor's own capabilities stand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from rlcp.controlplane.workers.spec import WorkerSpec, WorkerStatus
from rlcp.core.wire.agent import PauseMode

WeightsKind = Literal["weights", "adapter"]  # what a staged worker's check looks for
Capability = Literal["control", "disk_weights", "checksums", "desired_version", "staged_update", "lora",
                     "broadcast"]


@runtime_checkable
class Driver(Protocol):
    spec: WorkerSpec

    async def status(self) -> WorkerStatus: ...


@runtime_checkable
class Control(Protocol):
    async def pause(self, mode: PauseMode, timeout_s: float) -> None: ...

    async def resume(self) -> None: ...


@runtime_checkable
class DiskWeights(Protocol):
    async def update_weights_from_disk(self, path: str, version: str) -> None: ...


@runtime_checkable
class Checksums(Protocol):
    async def weight_checksums(self) -> dict[str, str]: ...


@runtime_checkable
class DesiredVersion(Protocol):
    async def set_desired_version(self, version: str | None) -> None:
        """Tell the worker the fleet's desired version: it reports not ready while behind."""


@dataclass(frozen=True)
class LoadReport:
    """What a staged load answers: the version the worker now reports, and its weight
    checksums when they were asked for."""

    weight_version: str | None
    checksums: dict[str, str] | None


@runtime_checkable
class StagedUpdate(Protocol):
    """A checked disk update: a check (is the checkpoint loadable there? nothing changes),
    then three round trips: prepare (told the desired version, then paused, answering the
    status; refused, with nothing changed, if the checkpoint is not loadable after all),
    load (reload, answering the version and checksums), resume (answering the status)."""

    async def check_weights(self, path: str, kind: WeightsKind = "weights") -> None: ...

    async def prepare_update(self, version: str, mode: PauseMode, timeout_s: float, *,
                             weights_path: str | None = None) -> WorkerStatus: ...

    async def load_reporting(self, path: str, version: str, *, checksums: bool) -> LoadReport: ...

    async def resume_reporting(self) -> WorkerStatus: ...


@runtime_checkable
class Lora(Protocol):
    async def load_lora(self, name: str, path: str, version: str | None) -> None: ...

    async def unload_lora(self, name: str) -> None: ...


@runtime_checkable
class BroadcastPeer(Protocol):
    async def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None: ...

    async def start_weight_update(self) -> None: ...

    async def update_weights(self, update_info: dict[str, Any], timeout_s: float) -> None: ...

    async def finish_weight_update(self, version: str | None) -> None: ...

    async def shutdown_weight_transfer(self) -> None: ...

    async def update_weight_version(self, version: str) -> None:
        """Name the weights the worker holds (after a finish that named none)."""


_PROTOCOLS: dict[Capability, type] = {
    "control": Control, "disk_weights": DiskWeights, "checksums": Checksums,
    "desired_version": DesiredVersion, "staged_update": StagedUpdate, "lora": Lora, "broadcast": BroadcastPeer,
}


@runtime_checkable
class PublishesRoutes(Protocol):
    def published_capabilities(self) -> frozenset[Capability] | None:
        """What the worker's published route list allows, or None when it published none.
        A worker started without a feature (Dynamo without --enable-lora) does not list its
        routes: the flavor could speak them, this member cannot serve them."""


def capabilities(driver: Driver) -> frozenset[Capability]:
    return frozenset(name for name in _PROTOCOLS if has(driver, name))


# isinstance against a runtime-checkable Protocol inspects every member each time (~5% of
# an update's CPU at 1,024 workers); what a class implements does not change.
_IMPLEMENTS: dict[tuple[type, Capability], bool] = {}
_PUBLISHES: dict[type, bool] = {}


def has(driver: Driver, capability: Capability) -> bool:
    key = (type(driver), capability)
    implements = _IMPLEMENTS.get(key)
    if implements is None:
        implements = _IMPLEMENTS[key] = isinstance(driver, _PROTOCOLS[capability])
    if not implements:
        return False
    publishes = _PUBLISHES.get(type(driver))
    if publishes is None:
        publishes = _PUBLISHES[type(driver)] = isinstance(driver, PublishesRoutes)
    published = driver.published_capabilities() if publishes else None  # type: ignore[attr-defined]
    return published is None or capability in published

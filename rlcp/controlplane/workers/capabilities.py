"""What a worker driver can do, as small structural Protocols, one per capability.

    Driver              every flavor: its spec, and a status read
    ├── Control         pause (abort | wait | keep) and resume
    ├── DiskWeights     reload weights from a directory, naming the version; and the disk
    │                   update's three steps (pause for it, load, resume), as the flavor composes them
    ├── Checksums       per-parameter weight checksums (verification beyond versions)
    ├── DesiredVersion  told the fleet's desired version, gates its own readiness on it
    ├── StagedUpdate    checks a checkpoint where it will read it, before anything changes,
    │                   then takes the whole update in one call (pause, load, checksums,
    │                   resume when told), answering what would otherwise be reads
    ├── Lora            load / hot-swap and unload adapters
    ├── Sleep           vLLM's sleep mode: sleep (level, mode), wake_up (tags)
    ├── PrefixCache     drop the engine's prefix cache (vLLM's `/reset_prefix_cache`)
    └── BroadcastPeer   vLLM's weight-transfer protocol (init, start, chunks, finish, ...),
                        spoken on the group by the peer's wire (`TransferWire`): vLLM's or SGLang's

A flavor implements the capabilities its engine has and no others: there is no method whose
only body is "not supported". Each flavor's class names the Protocols it implements among its
bases, so the type checker holds every method to the Protocol's signature; at run time
`capabilities(driver)` (or `has`) says the same, and operations ask it before touching any
worker, so an operation a member cannot do is refused up front, naming the worker and what it
lacks.

`Can[P]` names one capability for the type checker: `implements(driver, CONTROL)` narrows a
`Driver` to `Control`, and a step over workers (`FanOut.each`, `workers.steps.Step`)
takes a call typed over the capability's Protocol, never over `Any`.

Where a worker publishes its route list (Dynamo's listing `routes`, kept in
`WorkerSpec.routes`), a driver that implements `PublishesRoutes` narrows its capabilities to
what the list allows; without a list the flavor's own capabilities stand. `has` follows the
list; `implements` (what a call can be typed over) does not: a member whose list leaves out a
capability its flavor has is still sent what an operation asks of it, as the worker decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeGuard, TypeVar, runtime_checkable

from rlcp.controlplane.errors import InvalidInput, MissingCapability
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus
from rlcp.core.wire.agent.control import PauseMode

WeightsKind = Literal["weights", "adapter"]  # what a staged worker's check looks for
Capability = Literal[
    "control",
    "disk_weights",
    "checksums",
    "desired_version",
    "staged_update",
    "lora",
    "broadcast",
    "sleep",
    "prefix_cache",
]
TransferWire = Literal["vllm", "sglang"]
"""How a broadcast peer joins the trainer's group and cuts the stream it receives: `vllm`, vLLM's
weight-transfer engines (the agent, stock vLLM); `sglang`, SGLang's `/init_weights_update_group`.
A trainer is rank 0 of a group of one wire, never of both (`require_one_transfer_wire`)."""
SleepMode = Literal["abort", "wait"]  # vLLM's sleep takes keep too; a kept request's KV would be dropped


@runtime_checkable
class Driver(Protocol):
    spec: WorkerSpec

    async def status(self) -> WorkerStatus: ...


@runtime_checkable
class Control(Driver, Protocol):
    async def pause(self, mode: PauseMode, timeout_s: float) -> None: ...

    async def resume(self) -> None: ...


@dataclass(frozen=True)
class LoadReport:
    """What a load answers where the call carries it: the version the worker now reports, and
    its weight checksums when they were asked for."""

    weight_version: str | None
    checksums: dict[str, str] | None


@runtime_checkable
class DiskWeights(Driver, Protocol):
    """A reload from a directory: one call (`update_weights_from_disk`, the reconciler's), and
    the update transaction's three steps, each one call of the operation's however the flavor
    composes it -- the agent in one round trip each, answering what would otherwise be a read;
    a stock engine in separate calls, answering nothing (None)."""

    loads_with_checksums: bool
    """`load_from_disk(checksums=True)` hashes the new weights in the same call (the step is
    given the hashing time on top of the load's)."""

    async def update_weights_from_disk(self, path: str, version: str) -> None: ...

    async def pause_for_update(
        self, version: str, mode: PauseMode, timeout_s: float, *, weights_path: str | None = None
    ) -> WorkerStatus | None:
        """Out of service for an update to `version`: told the version where the worker gates
        its readiness on it, then paused (`mode`, bounded by `timeout_s`). `weights_path`: the
        checkpoint, checked once more where the worker can (refused, nothing changed, if it is
        not loadable after all). Answers the worker's status where the call carries it."""

    async def load_from_disk(self, path: str, version: str, *, checksums: bool) -> LoadReport | None:
        """Reload `path` as `version`. Answers the version now held (and, if `checksums`, the
        new weights' checksums) where the call carries them; None: read them separately."""

    async def resume_after_update(self) -> WorkerStatus | None:
        """Back in service; answers the worker's status where the call carries it."""


@runtime_checkable
class Checksums(Driver, Protocol):
    covers_adapters: bool
    """Whether the checksums include the adapters' tensors (the agent's `lora:<name>:` keys);
    stock vLLM's cover the base model only, so they tell nothing about an adapter."""

    async def weight_checksums(self) -> dict[str, str] | None:
        """Per-parameter checksums; None: this worker cannot compute them (verify by version)."""


@runtime_checkable
class DesiredVersion(Driver, Protocol):
    async def set_desired_version(self, version: str | None) -> None:
        """Tell the worker the fleet's desired version: it reports not ready while behind."""


@dataclass(frozen=True)
class UpdatePlan:
    """One worker's part of a disk update, for a worker that takes it in one call."""

    path: str
    version: str  # loaded as, and desired
    mode: PauseMode
    pause_timeout_s: float
    checksums: bool  # answer the new weights' checksums
    resume: bool  # resume in the same call once loaded ...
    expected_checksums: dict[str, str] | None  # ... and, when given, only if they agree with these


@dataclass(frozen=True)
class UpdateReport:
    """What a disk update's load step answered (`workers/updates.py`): the version and checksums
    (None: read them separately), the worker's state after it (None: not carried), and whether it
    resumed in the same call (`held_back`: why not, although told to)."""

    load: LoadReport | None
    status: WorkerStatus | None
    resumed: bool = False
    held_back: str | None = None


@runtime_checkable
class StagedUpdate(DiskWeights, Protocol):
    """A checked disk update at the floor of its round trips: a check (is the checkpoint
    loadable there? nothing changes) before anyone pauses, then the whole update in one call
    (`update_in_one_call`) instead of `DiskWeights`' three steps."""

    async def check_weights(self, path: str, kind: WeightsKind = "weights") -> None: ...

    async def update_in_one_call(self, plan: UpdatePlan) -> UpdateReport:
        """Checked again, told the version, paused (unless paused), loaded, hashed, and resumed
        if the plan says so; a failure after the pause leaves the worker paused."""


@dataclass(frozen=True)
class LoraLoaded:
    """What an adapter load answers where the call carries it: the adapter's checksums as the
    worker holds it (when asked), and the worker's status after the load."""

    checksums: dict[str, str] | None
    status: WorkerStatus | None


@runtime_checkable
class Lora(Driver, Protocol):
    async def load_lora(
        self, name: str, path: str, version: str | None, *, checksums: bool = False
    ) -> LoraLoaded | None:
        """Load or hot-swap `name`. With `checksums`, answers the adapter's checksums where the
        worker's checksums cover adapters and its call can carry them; None: nothing answered."""

    async def unload_lora(self, name: str) -> None: ...


@runtime_checkable
class BroadcastPeer(Driver, Protocol):
    transfer_wire: TransferWire
    """The group this peer joins and the stream it expects (`TransferWire`)."""

    def init_info_problem(self, init_info: dict[str, Any]) -> tuple[str, str] | None:
        """(the key, why) if this peer's group cannot take `init_info`; None if it can, or if only
        the worker itself can tell. Pure: asked before any worker is touched."""

    def update_info_problem(self, chunk: dict[str, Any]) -> tuple[str, str] | None:
        """Likewise for one update chunk."""

    async def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None: ...

    async def start_weight_update(self) -> None: ...

    async def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]], timeout_s: float) -> None: ...

    async def finish_weight_update(self, version: str | None) -> None: ...

    async def shutdown_weight_transfer(self) -> None: ...

    async def update_weight_version(self, version: str) -> None:
        """Name the weights the worker holds (after a finish that named none)."""


@runtime_checkable
class Sleep(Driver, Protocol):
    """vLLM's sleep mode (`AsyncLLM.sleep` / `wake_up`): the engine stops scheduling (`mode`
    says what happens to running requests) and releases its accelerator memory -- level 1
    offloads the weights to host memory, level 2 discards them -- until woken. Whether it is
    asleep comes back in `status().sleeping`."""

    # Whether a wake may name some allocations (`weights`, `kv_cache`) and a later one the
    # rest; Dynamo's wakes everything at once.
    partial_wake: bool

    async def sleep(self, level: int, mode: SleepMode, timeout_s: float) -> None: ...

    async def wake_up(self, tags: list[str] | None) -> None:
        """Wake every allocation (None) or only the tagged ones (`weights`, `kv_cache`)."""


@runtime_checkable
class PrefixCache(Driver, Protocol):
    """vLLM's prefix-cache reset (`EngineClient.reset_prefix_cache`). A reset the engine could
    not do (blocks still held by running requests, without `running`) is an error: the caller
    asked for an empty cache and did not get one."""

    async def reset_prefix_cache(self, *, running: bool, external: bool) -> None: ...


@runtime_checkable
class EngineRoutes(Driver, Protocol):
    """Runs one of its engine's own routes as it is (the guarded passthrough,
    `operations/engine.py`); which routes may be run is the controller's allowlist, not the driver's."""

    async def engine_call(self, method: Literal["GET", "POST"], route: str, body: Any) -> Any: ...


@runtime_checkable
class ServerConfig(Driver, Protocol):
    """Reports its engine's resolved configuration, vLLM's `/server_info?config_format=json`
    `vllm_config` (the fleet's `GET /server_info` merges the members')."""

    async def server_config(self) -> dict[str, Any]: ...


@runtime_checkable
class PublishesRoutes(Protocol):
    def published_capabilities(self) -> frozenset[Capability] | None:
        """What the worker's published route list allows, or None when it published none.
        A worker started without a feature (Dynamo without --enable-lora) does not list its
        routes: the flavor could speak them, this member cannot serve them."""


P = TypeVar("P", bound=Driver, covariant=True)


@dataclass(frozen=True, eq=False)
class Can(Generic[P]):
    """One capability, typed: its name and the test that proves a driver has its Protocol."""

    name: Capability | Literal["driver", "engine_routes", "server_config", "update_steps"]
    test: Callable[[Driver], TypeGuard[P]]


def _driver(d: Driver) -> TypeGuard[Driver]:
    return True  # what every flavor is (a spec, a status read)


def _control(d: Driver) -> TypeGuard[Control]:
    return isinstance(d, Control)


def _disk_weights(d: Driver) -> TypeGuard[DiskWeights]:
    return isinstance(d, DiskWeights)


def _checksums(d: Driver) -> TypeGuard[Checksums]:
    return isinstance(d, Checksums)


def _desired_version(d: Driver) -> TypeGuard[DesiredVersion]:
    return isinstance(d, DesiredVersion)


def _staged_update(d: Driver) -> TypeGuard[StagedUpdate]:
    return isinstance(d, StagedUpdate)


def _lora(d: Driver) -> TypeGuard[Lora]:
    return isinstance(d, Lora)


def _broadcast(d: Driver) -> TypeGuard[BroadcastPeer]:
    return isinstance(d, BroadcastPeer)


def _sleep(d: Driver) -> TypeGuard[Sleep]:
    return isinstance(d, Sleep)


def _prefix_cache(d: Driver) -> TypeGuard[PrefixCache]:
    return isinstance(d, PrefixCache)


def _engine_routes(d: Driver) -> TypeGuard[EngineRoutes]:
    return isinstance(d, EngineRoutes)


def _server_config(d: Driver) -> TypeGuard[ServerConfig]:
    return isinstance(d, ServerConfig)


DRIVER = Can("driver", _driver)
SERVER_CONFIG = Can("server_config", _server_config)
ENGINE_ROUTES = Can("engine_routes", _engine_routes)
CONTROL = Can("control", _control)
DISK_WEIGHTS = Can("disk_weights", _disk_weights)
CHECKSUMS = Can("checksums", _checksums)
DESIRED_VERSION = Can("desired_version", _desired_version)
STAGED_UPDATE = Can("staged_update", _staged_update)
LORA = Can("lora", _lora)
BROADCAST = Can("broadcast", _broadcast)
SLEEP = Can("sleep", _sleep)
PREFIX_CACHE = Can("prefix_cache", _prefix_cache)

_ALL: dict[Capability, Can[Driver]] = {
    "control": CONTROL,
    "disk_weights": DISK_WEIGHTS,
    "checksums": CHECKSUMS,
    "desired_version": DESIRED_VERSION,
    "staged_update": STAGED_UPDATE,
    "lora": LORA,
    "broadcast": BROADCAST,
    "sleep": SLEEP,
    "prefix_cache": PREFIX_CACHE,
}
# isinstance against a runtime-checkable Protocol inspects every member each time (~5% of
# an update's CPU at 1,024 workers); what a class implements does not change.
_IMPLEMENTS: dict[tuple[type, str], bool] = {}
_PUBLISHES: dict[type, bool] = {}


def implements(driver: Driver, can: Can[P]) -> TypeGuard[P]:
    """Whether the driver's flavor implements the capability's Protocol (the published route
    list aside): what lets a call be typed over that Protocol."""
    key = (type(driver), can.name)
    found = _IMPLEMENTS.get(key)
    if found is None:
        found = _IMPLEMENTS[key] = bool(can.test(driver))
    return found


def capable(drivers: Iterable[Driver], can: Can[P]) -> list[P]:
    """The drivers that implement `can`, typed as its Protocol."""
    return [d for d in drivers if implements(d, can)]


def capabilities(driver: Driver) -> frozenset[Capability]:
    return frozenset(name for name in _ALL if has(driver, name))


def has(driver: Driver, capability: Capability) -> bool:
    """Whether the member can do it: its flavor implements it, and the routes it published
    (where it published any) allow it."""
    if not implements(driver, _ALL[capability]):
        return False
    publishes = _PUBLISHES.get(type(driver))
    if publishes is None:
        publishes = _PUBLISHES[type(driver)] = isinstance(driver, PublishesRoutes)
    if not publishes or not isinstance(driver, PublishesRoutes):  # the second test only for a type that does
        return True
    published = driver.published_capabilities()
    return published is None or capability in published


def refuse_transfer_input(
    drivers: Iterable[Driver], init_info: dict[str, Any] | None = None, update_info: Any = None
) -> None:
    """A 422 naming the field, before any worker is touched, for an `init_info` or an update
    chunk some member's group cannot take (SGLang's takes fewer keys than vLLM's)."""
    chunks = update_info if isinstance(update_info, list) else [update_info] if update_info is not None else []
    for d in drivers:
        if not implements(d, BROADCAST):
            continue
        if init_info is not None and (problem := d.init_info_problem(init_info)) is not None:
            key, why = problem
            raise InvalidInput(f"{d.spec.id}: {why}", field=f"init_info.{key}" if key else "init_info")
        for chunk in chunks:
            if isinstance(chunk, dict) and (problem := d.update_info_problem(chunk)) is not None:
                key, why = problem
                raise InvalidInput(f"{d.spec.id}: {why}", field=f"update_info.{key}" if key else "update_info")


def require_one_transfer_wire(drivers: Iterable[Driver]) -> None:
    """Refuse, before any worker is touched, a broadcast group whose peers speak different wires.

    They cannot meet in one group (checked against vLLM 0.32 and SGLang 0.5.23's code): SGLang
    joins a `torch.distributed` process group (`init_custom_process_group`: the group's gloo or
    NCCL keys under `<group>/<group>//<device>/` in the trainer's TCP store) and receives one
    broadcast per tensor, in its dtype; vLLM's engines join through vLLM's `StatelessProcessGroup`
    (gloo under its own store prefix, NCCL through PyNccl's unique id and a warm-up all-reduce),
    and its gloo and packed NCCL backends cut the tensors into shared byte buffers. No trainer is
    rank 0 of both rendezvous at once, and the bytes would not line up if it were."""
    wires: dict[TransferWire, list[str]] = {}
    for d in drivers:
        if implements(d, BROADCAST):
            wires.setdefault(d.transfer_wire, []).append(d.spec.id)
    if len(wires) < 2:
        return
    sglang = sorted(wires.get("sglang", []))
    others = sorted(w for wire, ids in wires.items() if wire != "sglang" for w in ids)
    raise MissingCapability(
        f"a broadcast weight transfer cannot mix SGLang members ({', '.join(sglang)}) with members on "
        f"vLLM's weight-transfer wire ({', '.join(others)}): SGLang joins a torch.distributed group "
        "(its init_weights_update_group) and takes one broadcast per tensor, vLLM's engines join through "
        "vLLM's StatelessProcessGroup (and its gloo backend packs tensors into shared buffers), so no "
        "trainer can be rank 0 of both. Broadcast to a fleet of one kind, or update a mixed fleet from "
        "disk (POST /v1/rl/update_weights)",
        workers=dict.fromkeys(sglang, "broadcast on vLLM's weight-transfer wire"),
    )

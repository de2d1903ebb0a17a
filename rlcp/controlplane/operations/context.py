"""What an operation may use, and the machinery every operation shares.

Operations (`weights`, `pause`, `lora`, `broadcast`, ...) see the controller through
`OperationContext`, a narrow Protocol -- the members, the fan-out, the gate, the desired
state keeper, named deadlines, the operation log -- never the whole controller. `Run` is one
operation in progress: its record, the members it is about (`operating_on`, narrowed by what
the operation declares), and `steps`, the executor its declared steps run on (`steps.py`).
`transaction.run_operation`, the one runner, executes an operation's declared steps on a `Run`
in the gate, the log context, and a final status refresh -- or, for a caller that does not wait,
answers once the gate is held and the record exists, the rest going on as a task of `Detached`
(a 409 or a 503 still comes before any answer).

The record is kept in the desired state's store twice, for a restart to find: as running
before any worker is touched (an update keeps it in the same write as its new desired
version: one write before the first pause, not two), and as ended. The ended record's write
is off the answer's path: the record is closed in memory (the log, `GET /v1/rl/operations`,
show it at once), the caller answered, and the write runs meanwhile, holding the gate, so the
next operation waits for it (`OperationGate.release_after`); a refused write is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from rlcp.controlplane.deadlines import Deadlines
from rlcp.controlplane.errors import ControlPlaneError, MissingCapability, NoMembers
from rlcp.controlplane.fleet.desired import DesiredKeeper
from rlcp.controlplane.fleet.members import FleetRegistry, WorkerRecord
from rlcp.controlplane.fleet.names import ModelNames
from rlcp.controlplane.fleet.publish import FenceSync
from rlcp.controlplane.metrics import ControllerMetrics
from rlcp.controlplane.operations.gate import OperationGate
from rlcp.controlplane.operations.record import OperationLog, OperationTracker
from rlcp.controlplane.operations.steps import Executor
from rlcp.controlplane.workers.capabilities import Capability, has
from rlcp.controlplane.workers.fanout import FanOut
from rlcp.core.wire.controller import DiskSource
from rlcp.core.wire.controller.operations import OperationKind, OperationResult

T = TypeVar("T")
# Operations that see members asleep. Every other one leaves them out, each named in its result
# (skipped): an engine asleep has no memory to update, adapt or resume, and a wake converges
# it to what the fleet became meanwhile. (A broadcast's init refuses them: its group spans
# every member's ranks.)
_SEES_ASLEEP: frozenset[OperationKind] = frozenset(
    {"sleep", "wake_up", "engine", "weight_transfer_init", "weight_transfer_update", "weight_transfer_shutdown"}
)
ASLEEP_SKIPPED = "asleep: left out until woken (POST /v1/rl/wake_up converges and verifies it)"
CANCELLED = "cancelled before its end (the controller stopped, or lost leadership)"
NOT_BEGUN = "not begun: its record could not be kept in the desired state's store"
SETTLE_S = 10.0  # how long a stopping controller waits for operations' closing writes


class OperationContext(Protocol):
    fleet: str
    names: ModelNames  # every fleet's model names: a name is served by one fleet
    registry: FleetRegistry
    fanout: FanOut
    gate: OperationGate
    desired: DesiredKeeper
    deadlines: Deadlines
    log: OperationLog
    metrics: ControllerMetrics
    allowed_roots: list[Path]
    detached: Detached
    fence_sync: FenceSync | None  # a data plane with its own copy of the fence (Envoy), if one is fed

    async def refresh(self, records: list[WorkerRecord]) -> None:
        """Read these workers' statuses now (the state document and the reconciler see them)."""


def require_capability(records: list[WorkerRecord], capability: Capability, operation: str) -> None:
    """Refuse, before any worker is touched, an operation some member cannot do."""
    lacking: dict[str, str] = {r.id: capability for r in records if not has(r.driver, capability)}
    if lacking:
        names = ", ".join(f"{worker_id} ({records_flavor(records, worker_id)})" for worker_id in sorted(lacking))
        raise MissingCapability(
            f"{operation} needs the {capability!r} capability, which these members lack: {names}", workers=lacking
        )


def operating_on(ctx: OperationContext, kind: OperationKind) -> list[WorkerRecord]:
    """The members an operation of `kind` is about: all of them, less those asleep unless it
    is one that sees them (`_SEES_ASLEEP`). Its pre-checks and its `Run` both ask here."""
    members = ctx.registry.members()
    if kind in _SEES_ASLEEP:
        return members
    asleep = ctx.desired.state.asleep
    return [r for r in members if r.id not in asleep]


def records_flavor(records: list[WorkerRecord], worker_id: str) -> str:
    return next(r.spec.flavor for r in records if r.id == worker_id)


class Run:
    """One operation in progress: its record, the members it is about, and the executor its
    steps run on (`steps.py`)."""

    def __init__(
        self,
        ctx: OperationContext,
        kind: OperationKind,
        detail: dict[str, Any],
        *,
        members: Callable[[list[WorkerRecord]], list[WorkerRecord]] | None = None,
        on_begun: Callable[[OperationTracker], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.kept = False  # the record is in the store as running (`begin`)
        self._on_begun = on_begun
        if not ctx.registry.members():
            raise NoMembers("the fleet has no members")
        seen = operating_on(ctx, kind)
        # Declared by the operation (a selector's members), read once the gate is held: a
        # refusal here comes before the record is begun, as one before the gate would.
        self.members: list[WorkerRecord] = members(seen) if members is not None else seen
        self.tracker: OperationTracker = ctx.log.begin(kind, epoch=ctx.registry.membership.epoch, detail=detail)
        self.steps = Executor(
            fanout=ctx.fanout,
            registry=ctx.registry,
            metrics=ctx.metrics,
            tracker=self.tracker,
            log=ctx.log,
            begun=lambda: self.kept,
        )
        asleep = ctx.desired.state.asleep
        if kind not in _SEES_ASLEEP:
            for r in ctx.registry.members():
                if r.id in asleep:
                    self.tracker.skip(r.id, "gate", ASLEEP_SKIPPED)
        self.fence_records: list[dict[str, object]] = []  # `publish_fence`'s, in order

    async def begin(self, *, disk_weights: tuple[str, DiskSource] | None = None) -> None:
        """Keep the record, as running, in the desired state's store: a controller that stops
        before `end` finds it there at its next start and lists it as interrupted. With
        `disk_weights` (an update's new version and source), in the same write as those."""
        record = self.tracker.snapshot()
        if disk_weights is None:
            await self.ctx.desired.note_operation(record)
        else:
            await self.ctx.desired.set_disk_weights(*disk_weights, begun=record)
        self.kept = True
        if self._on_begun is not None:
            self._on_begun(self.tracker)

    def close(self, *, interrupted: str | None = None) -> OperationResult:
        return self.ctx.log.close(self.tracker, interrupted=interrupted)

    async def end(self, *, interrupted: str | None = None) -> OperationResult:
        """`close`, and the ended record kept before this returns (a broadcast session's end,
        which holds the gate across calls of its own; `run_operation` keeps it after answering)."""
        result = self.close(interrupted=interrupted)
        await self.keep_end(result)
        return result

    async def keep_end(self, result: OperationResult) -> None:
        """The ended record (`close`'s) kept in the store. A store that refuses the write changes
        nothing the operation did: the next start lists it as interrupted."""
        try:
            await self.ctx.desired.note_operation(result)
        except (ControlPlaneError, OSError) as exc:
            structlog.get_logger("rlcp.controlplane.operations").warning(
                "operation_end_not_kept",
                status=result.status,
                error=getattr(exc, "message", None) or repr(exc),
            )

    def answering(self, records: list[WorkerRecord]) -> list[WorkerRecord]:
        """The records worth a fresh status read before answering: not one whose status came
        back with its last call, nor one that failed in this operation. A failed worker is
        often one that cannot answer (killed, hung, unreachable), and reading it again would
        make the trainer wait a status deadline -- or a connect's retries -- for nothing it can
        use: its result already says what went wrong (`code`), and the background poller reads
        it when it answers. So a 207 or 502 leaves as soon as the last worker's result is in.
        What the operation did to it is known without a read (`Executor.run`: a failed update
        leaves it paused, and the state says so)."""
        failed = {r.worker_id for r in self.tracker.results.values() if r.status in ("error", "timeout")}
        return [r for r in records if r.id not in failed and r.id not in self.steps.reported]

    async def publish_fence(self) -> None:
        """After narrowing the fence, before pausing anyone it left: every data plane holding its
        own copy of the fence (`fleet/publish.py`) has it, or its deadline passed, and the record
        says which (`fence_published`, one entry per wave)."""
        sync = self.ctx.fence_sync
        if sync is None:
            return
        published = await sync.publish()
        self.fence_records.append(published.record())
        self.tracker.note(fence_published=self.fence_records)
        if published.unacked:
            structlog.get_logger("rlcp.controlplane.operations").warning(
                "fence_not_acknowledged",
                version=published.version,
                waited_s=round(published.waited_s, 3),
                unacked=published.unacked,
            )

    def bound(self) -> AbstractContextManager[None]:
        """Log context of this operation (operation id and kind on every line)."""
        return structlog.contextvars.bound_contextvars(operation_id=self.tracker.id, operation=self.tracker.kind)


class Detached:
    """Operations whose callers did not wait: held so they are not collected mid-way, and
    cancelled when the controller stops (the persisted desired state lets the next leader
    converge whatever they left)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._settling: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def settle(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Bookkeeping that goes on after an answer (an operation's closing write): awaited on
        `close`, not cancelled, so what a stopping controller did is kept as it ended; a failure
        is logged."""
        task = asyncio.create_task(coro, name=name)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        task.add_done_callback(log_failure)
        return task

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # The cancelled operations' closing writes included. A store that hangs past the bound
        # is given up on: the next start lists those operations as interrupted.
        settling = list(self._settling)
        if settling:
            _, pending = await asyncio.wait(settling, timeout=SETTLE_S)
            for task in pending:
                structlog.get_logger("rlcp.controlplane.operations").warning(
                    "operation_end_not_kept",
                    task=task.get_name(),
                    error=f"not written within {SETTLE_S:g}s of stopping",
                )
                task.cancel()


def log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        structlog.get_logger("rlcp.controlplane.operations").error(
            "detached_operation_failed", task=task.get_name(), error=repr(task.exception())
        )

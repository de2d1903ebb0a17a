"""What an operation may use, and the machinery every operation shares.

Operations (`weights`, `pause`, `lora`, `broadcast`) see the controller through
`OperationContext`, a narrow Protocol -- the members, the fan-out, the gate, the desired
state keeper, named deadlines, the operation log -- never the whole controller. `Run` is one
operation in progress: its tracker, its phase, and `step`, one fan-out over a set of
workers whose results it records; `run_operation` wraps a body in the gate, the log
context, and a final status refresh, and runs it to the end -- or, for a caller that does
not wait, answers once the gate is held and the record exists, the body going on as a
task of `Detached` (a 409 or a 503 still comes before any answer).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from rlcp.controlplane.deadlines import Deadlines
from rlcp.controlplane.errors import MissingCapability, NoMembers
from rlcp.controlplane.fleet.desired import DesiredKeeper
from rlcp.controlplane.fleet.registry import FleetRegistry, WorkerRecord
from rlcp.controlplane.metrics import ControllerMetrics
from rlcp.controlplane.operations.gate import OperationGate
from rlcp.controlplane.operations.record import OperationLog, OperationTracker
from rlcp.controlplane.workers.capabilities import Capability, has
from rlcp.controlplane.workers.fanout import FanOut, Outcome
from rlcp.core.wire.controller import OperationKind, OperationResult, Phase, WorkerResult

T = TypeVar("T")
Call = Callable[[Any], Awaitable[T]]  # one call on a driver
_PAUSE_STEPS = {"pause": True, "resume": False}  # steps whose success says the worker's pause state


class OperationContext(Protocol):
    registry: FleetRegistry
    fanout: FanOut
    gate: OperationGate
    desired: DesiredKeeper
    deadlines: Deadlines
    log: OperationLog
    metrics: ControllerMetrics
    allowed_roots: list[Path]
    detached: Detached

    async def refresh(self, records: list[WorkerRecord]) -> None:
        """Read these workers' statuses now (the state document and the reconciler see them)."""


def require_capability(records: list[WorkerRecord], capability: Capability, operation: str) -> None:
    """Refuse, before any worker is touched, an operation some member cannot do."""
    lacking = {r.id: capability for r in records if not has(r.driver, capability)}
    if lacking:
        names = ", ".join(f"{worker_id} ({records_flavor(records, worker_id)})" for worker_id in sorted(lacking))
        raise MissingCapability(f"{operation} needs the {capability!r} capability, which these members lack: "
                                f"{names}", workers=lacking)


def records_flavor(records: list[WorkerRecord], worker_id: str) -> str:
    return next(r.spec.flavor for r in records if r.id == worker_id)


class Run:
    """One operation in progress: tracker, phase, and fan-out over a set of workers."""

    def __init__(self, ctx: OperationContext, kind: OperationKind, detail: dict[str, Any]) -> None:
        self.ctx = ctx
        self.members = ctx.registry.members()
        if not self.members:
            raise NoMembers("the fleet has no members")
        self.tracker: OperationTracker = ctx.log.begin(kind, epoch=ctx.registry.membership.epoch, detail=detail)
        # Workers whose last call in this run answered their status (a staged update's
        # resume): already fresh, so the final read skips them.
        self.reported: set[str] = set()

    async def step(self, phase: Phase | None, name: str, records: list[WorkerRecord], fn: Call[T],
                   deadline_s: float) -> list[WorkerRecord]:
        """Run `fn` on `records`; record results; return the records that succeeded."""
        ok, _ = await self.step_values(phase, name, records, fn, deadline_s)
        return ok

    async def step_values(self, phase: Phase | None, name: str, records: list[WorkerRecord], fn: Call[T],
                          deadline_s: float) -> tuple[list[WorkerRecord], dict[str, T]]:
        """`step`, also returning what each call that succeeded answered, by worker id."""
        if phase is not None:
            self.ctx.log.set_phase(phase)
        outcomes: list[Outcome[T]] = await self.ctx.fanout.run([r.driver for r in records], fn, phase=name,
                                                               deadline_s=deadline_s)
        self.tracker.record(outcomes)
        for o in outcomes:
            self.ctx.registry.record_result(o.result)
            if not o.ok:
                self.ctx.metrics.worker_failures.labels(o.worker_id, name).inc()
            elif name in _PAUSE_STEPS:
                # A pause or resume the worker took is its pause state now: the state shows it
                # at once, also for a worker a later step fails and no final read refreshes.
                self.ctx.registry.note_paused(o.worker_id, _PAUSE_STEPS[name])
        ok = {o.worker_id: o.value for o in outcomes if o.ok}
        return [r for r in records if r.id in ok], ok  # type: ignore[return-value]

    def report(self, results: Iterable[WorkerResult]) -> None:
        """Results found before any step ran (a checkpoint a worker cannot load): recorded as
        a step's would be, in the operation and on each worker."""
        for result in results:
            self.tracker.set_result(result)
            self.ctx.registry.record_result(result)

    async def best_effort(self, name: str, records: list[WorkerRecord], fn: Call[Any], deadline_s: float) -> None:
        """A clean-up step whose failures do not replace a worker's first error."""
        outcomes = await self.ctx.fanout.run([r.driver for r in records], fn, phase=name, deadline_s=deadline_s)
        for o in outcomes:
            first = self.tracker.results.get(o.worker_id)
            if not o.ok and first is not None and first.status != "ok":
                note = f"; then {name} failed: {o.result.message}"
                self.tracker.set_result(first.model_copy(update={"message": (first.message or "") + note}))
            else:
                self.tracker.set_result(o.result)

    def close(self) -> OperationResult:
        return self.ctx.log.close(self.tracker)

    def answering(self, records: list[WorkerRecord]) -> list[WorkerRecord]:
        """The records worth a fresh status read before answering: not one whose status came
        back with its last call, nor one that failed in this operation. A failed worker is
        often one that cannot answer (killed, hung, unreachable), and reading it again would
        make the trainer wait a status deadline -- or a connect's retries -- for nothing it can
        use: its result already says what went wrong (`code`), and the background poller reads
        it when it answers. So a 207 or 502 leaves as soon as the last worker's result is in.
        What the operation did to it is known without a read (`step_values`: a failed update
        leaves it paused, and the state says so)."""
        failed = {r.worker_id for r in self.tracker.results.values() if r.status in ("error", "timeout")}
        return [r for r in records if r.id not in failed and r.id not in self.reported]

    def bound(self) -> Any:
        """Log context of this operation (operation id and kind on every line)."""
        return structlog.contextvars.bound_contextvars(operation_id=self.tracker.id, operation=self.tracker.kind)


class Detached:
    """Operations whose callers did not wait: held so they are not collected mid-way, and
    cancelled when the controller stops (the persisted desired state lets the next leader
    converge whatever they left)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def run_operation(ctx: OperationContext, kind: OperationKind, detail: dict[str, Any],
                        body: Callable[[Run], Awaitable[None]], *, wait: bool = True) -> OperationResult:
    """`body` as one gated operation; answers once the workers' fresh statuses are read, or,
    with `wait=False`, as soon as it has begun (its record says "running")."""
    begun: asyncio.Future[OperationTracker] = asyncio.get_running_loop().create_future()

    async def whole() -> OperationResult:
        async with ctx.gate.api_operation(kind):
            run = Run(ctx, kind, detail)
            if not begun.done():
                begun.set_result(run.tracker)
            with run.bound():
                try:
                    await body(run)
                finally:
                    result = run.close()
            # Refresh the cache so the state endpoint (and the reconciler) see the outcome now.
            await ctx.refresh(run.answering(run.members))
            return result

    if wait:
        return await whole()
    task = ctx.detached.spawn(whole(), name=f"operation-{kind}")
    await asyncio.wait([begun, task], return_when=asyncio.FIRST_COMPLETED)
    if not begun.done():  # refused before it began (the gate, no members): the caller hears why
        begun.cancel()
        return task.result()
    task.add_done_callback(_log_failure)
    return begun.result().snapshot()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        structlog.get_logger("rlcp.controlplane.operations").error(
            "detached_operation_failed", task=task.get_name(), error=repr(task.exception()))

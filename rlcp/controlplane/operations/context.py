"""What an operation may use, and the machinery every operation shares.

Operations (`weights`, `pause`, `lora`, `broadcast`) see the controller through
`OperationContext`, a narrow Protocol -- the members, the fan-out, the gate, the desired
state keeper, named deadlines, the operation log -- never the whole controller. `Run` is one
operation in progress: its tracker, its phase, and `step`, one fan-out over a set of
workers whose results it records. A step is one call per worker, typed over the Protocol of
the capability the workers were checked for (`workers/capabilities.py`); which of its
engine's routes a flavor sends for it is the driver's business, never the operation's.
`run_operation` wraps a body in the gate, the log context, and a final status refresh, and
runs it to the end -- or, for a caller that does not wait, answers once the gate is held and
the record exists, the body going on as a task of `Detached` (a 409 or a 503 still comes
before any answer).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import structlog

from rlcp.controlplane.deadlines import Deadlines
from rlcp.controlplane.errors import ControlPlaneError, MissingCapability, NoMembers
from rlcp.controlplane.fleet.desired import DesiredKeeper
from rlcp.controlplane.fleet.members import FleetRegistry, WorkerRecord
from rlcp.controlplane.fleet.names import ModelNames
from rlcp.controlplane.fleet.publish import FenceSync
from rlcp.controlplane.metrics import ControllerMetrics, Step
from rlcp.controlplane.operations.gate import OperationGate
from rlcp.controlplane.operations.record import OperationLog, OperationTracker
from rlcp.controlplane.workers.capabilities import Can, Capability, Driver, has
from rlcp.controlplane.workers.fanout import FanOut, Outcome
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.controller import OperationKind, OperationResult, Phase, WorkerResult

T = TypeVar("T")
P = TypeVar("P", bound=Driver)
# Steps whose success says the pause state (a sleep pauses first).
_PAUSE_STEPS: dict[Step, bool] = {"pause": True, "resume": False, "sleep": True}
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


def records_flavor(records: list[WorkerRecord], worker_id: str) -> str:
    return next(r.spec.flavor for r in records if r.id == worker_id)


@dataclass(frozen=True)
class StepDone(Generic[T]):
    """The records a step succeeded on, and what each of their calls answered, by worker id;
    and the HTTP status each worker that refused its call answered, by worker id."""

    ok: list[WorkerRecord]
    answers: dict[str, T | None]
    refused: dict[str, int]


class Run:
    """One operation in progress: tracker, phase, and fan-out over a set of workers."""

    def __init__(self, ctx: OperationContext, kind: OperationKind, detail: dict[str, Any]) -> None:
        self.ctx = ctx
        self.members = ctx.registry.members()
        if not self.members:
            raise NoMembers("the fleet has no members")
        self.tracker: OperationTracker = ctx.log.begin(kind, epoch=ctx.registry.membership.epoch, detail=detail)
        asleep = ctx.desired.state.asleep
        if asleep and kind not in _SEES_ASLEEP:
            for r in self.members:
                if r.id in asleep:
                    self.tracker.skip(r.id, "gate", ASLEEP_SKIPPED)
            self.members = [r for r in self.members if r.id not in asleep]
        # Workers whose last call in this run answered their status (an update's resume, for a
        # driver whose resume answers it): already fresh, so the final read skips them.
        self.reported: set[str] = set()
        self.fence_records: list[dict[str, object]] = []  # `publish_fence`'s, in order

    async def step(
        self,
        phase: Phase | None,
        step: Step,
        records: list[WorkerRecord],
        can: Can[P],
        call: Callable[[P], Awaitable[object]],
        deadline_s: float,
        *,
        shown_as: str | None = None,
    ) -> list[WorkerRecord]:
        """Run `call` on `records`; record results; return the records that succeeded."""
        return (await self.step_values(phase, step, records, can, call, deadline_s, shown_as=shown_as)).ok

    async def step_values(
        self,
        phase: Phase | None,
        step: Step,
        records: list[WorkerRecord],
        can: Can[P],
        call: Callable[[P], Awaitable[T]],
        deadline_s: float,
        *,
        shown_as: str | None = None,
        after_failure: bool = False,
    ) -> StepDone[T]:
        """`step`, also keeping what each call that succeeded answered.

        `call` is typed over the Protocol of `can`, the capability the operation checked its
        members for (`require_capability`). `step` is the step's name, one of a closed set (the
        metrics' label); `shown_as` the result's phase text where it says more (a broadcast
        chunk's number). `after_failure`: a step that makes good a worker's failure (a pause
        after a failed verification): its result stays that failure, with this step's own
        failure added to the message."""
        if phase is not None:
            self.ctx.log.set_phase(phase)
        outcomes = await self.ctx.fanout.each(
            [r.driver for r in records], can, call, phase=shown_as or step, deadline_s=deadline_s
        )
        if after_failure:
            self._note_after_failure(outcomes, shown_as or step)
        else:
            self.tracker.record(outcomes)
        for o in outcomes:
            self.ctx.registry.record_result(o.result)
            if not o.ok:
                self.ctx.metrics.worker_failures.inc(o.worker_id, step)
            elif step in _PAUSE_STEPS:
                # A pause or resume the worker took is its pause state now: the state shows it
                # at once, also for a worker a later step fails and no final read refreshes.
                self.ctx.registry.note_paused(o.worker_id, _PAUSE_STEPS[step])
        answers = {o.worker_id: o.value for o in outcomes if o.ok}
        refused = {o.worker_id: o.refused_with for o in outcomes if o.refused_with is not None}
        return StepDone([r for r in records if r.id in answers], answers, refused)

    def _note_after_failure(self, outcomes: Iterable[Outcome[Any]], what: str) -> None:
        for o in outcomes:
            first = self.tracker.results.get(o.worker_id)
            if first is None or first.status == "ok":
                self.tracker.set_result(o.result)
            elif not o.ok:
                note = f"; then {what} failed: {o.result.message}"
                self.tracker.set_result(first.model_copy(update={"message": (first.message or "") + note}))

    def passed(self, worker_id: str, phase: str) -> None:
        """A worker's result moves on to `phase`, done in a call an earlier step made (an update
        taken in one call resumes in it): still ok, the same call's duration."""
        result = self.tracker.results.get(worker_id)
        if result is not None and result.status == "ok":
            result = result.model_copy(update={"phase": phase})
            self.tracker.set_result(result)
            self.ctx.registry.record_result(result)

    def observe_status(self, worker_id: str, status: WorkerStatus | None, *, final: bool = False) -> None:
        """A worker's answer that is its status: recorded as a fresh read (the status poll skips
        it this interval). `final`: nothing later in the operation changes it, so the read
        before the operation answers skips it too."""
        if status is None:
            return
        self.ctx.registry.observe(
            Outcome(worker_id, WorkerResult(worker_id=worker_id, status="ok", phase="status"), status), reported=True
        )
        if final:
            self.reported.add(worker_id)

    def report(self, results: Iterable[WorkerResult]) -> None:
        """Results found before any step ran (a checkpoint a worker cannot load): recorded as
        a step's would be, in the operation and on each worker."""
        for result in results:
            self.tracker.set_result(result)
            self.ctx.registry.record_result(result)

    async def best_effort(
        self,
        step: Step,
        records: list[WorkerRecord],
        can: Can[P],
        call: Callable[[P], Awaitable[object]],
        deadline_s: float,
        *,
        shown_as: str,
    ) -> None:
        """A clean-up step whose failures do not replace a worker's first error."""
        outcomes = await self.ctx.fanout.each(
            [r.driver for r in records], can, call, phase=shown_as, deadline_s=deadline_s
        )
        for o in outcomes:
            first = self.tracker.results.get(o.worker_id)
            if not o.ok and first is not None and first.status != "ok":
                note = f"; then {shown_as} failed: {o.result.message}"
                self.tracker.set_result(first.model_copy(update={"message": (first.message or "") + note}))
            else:
                self.tracker.set_result(o.result)

    async def begin(self) -> None:
        """Keep the record, as running, in the desired state's store: a controller that stops
        before `end` finds it there at its next start and lists it as interrupted."""
        await self.ctx.desired.note_operation(self.tracker.snapshot())

    def close(self, *, interrupted: str | None = None) -> OperationResult:
        return self.ctx.log.close(self.tracker, interrupted=interrupted)

    async def end(self, *, interrupted: str | None = None) -> OperationResult:
        """`close`, and the ended record kept in the store. A store that refuses the write
        changes nothing the operation did: the next start lists it as interrupted."""
        result = self.close(interrupted=interrupted)
        try:
            await self.ctx.desired.note_operation(result)
        except (ControlPlaneError, OSError) as exc:
            structlog.get_logger("rlcp.controlplane.operations").warning(
                "operation_end_not_kept", error=getattr(exc, "message", None) or repr(exc)
            )
        return result

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


async def run_operation(
    ctx: OperationContext,
    kind: OperationKind,
    detail: dict[str, Any],
    body: Callable[[Run], Awaitable[None]],
    *,
    wait: bool = True,
) -> OperationResult:
    """`body` as one gated operation; answers once the workers' fresh statuses are read, or,
    with `wait=False`, as soon as it has begun (its record says "running")."""
    begun: asyncio.Future[OperationTracker] = asyncio.get_running_loop().create_future()

    async def whole() -> OperationResult:
        async with ctx.gate.api_operation(kind):
            run = Run(ctx, kind, detail)
            with run.bound():
                interrupted: str | None = NOT_BEGUN
                try:
                    await run.begin()
                    interrupted = None
                    if not begun.done():
                        begun.set_result(run.tracker)
                    await body(run)
                except asyncio.CancelledError:
                    interrupted = CANCELLED
                    raise
                finally:
                    result = await run.end(interrupted=interrupted)
            # Refresh the cache so the state endpoint (and the reconciler) see the outcome now.
            await ctx.refresh(run.answering(run.members))
            return result

    if wait:
        return await whole()
    task = ctx.detached.spawn(whole(), name=f"operation-{kind}")
    waiting: list[asyncio.Future[Any]] = [begun, task]
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not begun.done():  # refused before it began (the gate, no members): the caller hears why
        begun.cancel()
        return task.result()
    task.add_done_callback(_log_failure)
    return begun.result().snapshot()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        structlog.get_logger("rlcp.controlplane.operations").error(
            "detached_operation_failed", task=task.get_name(), error=repr(task.exception())
        )

"""The one transaction runner: an operation declares its steps, `run_operation` executes them.

An operation is a generator of *effects*, written in the order they happen, with the pure
decisions between them (who the next step reaches, what a wave's verification decided) as plain
code; it never awaits. Each effect is data, and the runner is the only code that performs one:

- `Ask(step, records)`: a read before anything begins (a checkpoint check), answered with each
  worker's outcome, nothing recorded;
- `Open(kind, detail)`: the gate taken, the operation's record made; answered with the `Run`
  (its members, its record, its executor). Everything before it is a pre-check: a refusal
  there (a 409, a 422) leaves nothing behind;
- `Begin(disk_weights=...)`: the record kept, as running, in the desired state's store -- with
  the new target in the same write, for an update -- before any worker is touched (the
  executor refuses a step before it). A transaction that touches nobody (a no-op) never begins;
- `Call(step, records)`: one declared step (`steps.py`) run on those workers, answered with its
  `StepDone`;
- `Write(change)`: a write of the desired state once begun (a pause's target);
- `PublishFence()`, `Refresh(records)`: the fence handed to a data plane with its own copy, a
  fresh status read (the failure paths').

When the generator returns, the transaction commits: the record closed (the caller answered)
and its ended write kept after the answer, holding the gate, so the next operation sees it. When
an effect fails, the failure is thrown into the generator at the effect (its `finally` clauses
undo what must be undone: a wave's cordon), and the transaction aborts: the record closed as
interrupted if it was never kept, or cancelled. `wait=False` answers once it has begun.

Every operation is declared so: the disk update (all at once and rolling, each flavor's steps
declared by its driver: `workers/updates.py`), pause and resume, sleep and wake, LoRA, the caches,
the engine passthrough, and the broadcast group's init, shutdown and renaming. A broadcast session
spans several requests (start, chunks, finish) and holds the gate between them: its begin is the
session's own, and each request's steps are performed on the session's `Run` (`perform`). The
reconciler's actions on one worker are declared too, and performed without a record
(`perform_unrecorded`: its status read, each action's step, the read once done).

This is SGLang's workflow executor cut for a control plane: the steps are declared by the
operation and each flavor's calls by its driver (`workers/capabilities.py`), and one loop runs
them, so an operation's path is the route, the operation, this runner, the executor, the fan-out
and the driver -- never back up into the operation (`tests/controlplane/operations/test_update_path.py`
counts it).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.operations.context import (
    CANCELLED,
    NOT_BEGUN,
    OperationContext,
    Run,
    log_failure,
)
from rlcp.controlplane.operations.record import OperationTracker
from rlcp.controlplane.operations.steps import Executor, P
from rlcp.controlplane.workers.steps import Step
from rlcp.core.wire.controller import DiskSource
from rlcp.core.wire.controller.operations import OperationKind, OperationResult

T = TypeVar("T")


@dataclass(frozen=True)
class Ask(Generic[P, T]):
    """A read before the operation opens: each worker's outcome, nothing recorded."""

    step: Step[P, T]
    records: list[WorkerRecord]


@dataclass(frozen=True)
class Open:
    """Take the gate and make the record; answered with the `Run`. `members`: which of the
    members the operation sees it is about, picked once the gate is held (a selector's)."""

    kind: OperationKind
    detail: dict[str, Any]
    members: Callable[[list[WorkerRecord]], list[WorkerRecord]] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class DiskTarget:
    """The desired state an update sets, written with its record as it begins."""

    version: str
    source: DiskSource


@dataclass(frozen=True)
class Begin:
    """Keep the record, as running, in the store (with `disk_weights` as the new desired
    weights, in the same write): no worker is touched before it."""

    disk_weights: DiskTarget | None = None


@dataclass(frozen=True)
class Call(Generic[P, T]):
    """Run one declared step on these workers; answered with its `StepDone`."""

    step: Step[P, T]
    records: list[WorkerRecord]


@dataclass(frozen=True)
class PublishFence:
    """Hand the fence to a data plane holding its own copy (`Run.publish_fence`)."""


@dataclass(frozen=True)
class Refresh:
    """Read these workers' statuses now."""

    records: list[WorkerRecord]


@dataclass(frozen=True)
class Write:
    """A write of the desired state after the record is kept (a `DesiredKeeper` call, not yet
    started: the runner awaits it): what a pause or a resume makes the fleet's target."""

    change: Awaitable[None] = field(compare=False)


@dataclass(frozen=True)
class Together:
    """Declared steps that run side by side (a wave's members of two flavors); answered with
    each one's value, in order."""

    parts: tuple[Generator[Effect, Any, Any], ...] = field(compare=False)


Effect = Ask[Any, Any] | Open | Begin | Call[Any, Any] | Write | PublishFence | Refresh | Together
Steps = Generator[Effect, Any, None]


async def run_operation(ctx: OperationContext, steps: Steps, *, wait: bool = True) -> OperationResult:
    """Execute one operation's declared steps: its pre-checks, the gate and the record
    (`Open`), then begin, steps, and commit or abort. Answers once the workers' fresh statuses
    are read, or, with `wait=False`, as soon as it has begun (its record says "running")."""
    opened = await _before_the_gate(ctx, steps)
    begun: asyncio.Future[OperationTracker] = asyncio.get_running_loop().create_future()

    def on_begun(tracker: OperationTracker) -> None:
        if not begun.done():
            begun.set_result(tracker)

    async def whole() -> OperationResult:
        async with ctx.gate.api_operation(opened.kind):
            run = Run(ctx, opened.kind, opened.detail, members=opened.members, on_begun=on_begun)
            with run.bound():
                interrupted: str | None = None
                try:
                    await _perform(functools.partial(_effect, run), steps, run)
                except asyncio.CancelledError:
                    interrupted = CANCELLED
                    raise
                except BaseException:
                    if not run.kept:
                        interrupted = NOT_BEGUN
                    raise
                finally:
                    steps.close()
                    result = run.close(interrupted=interrupted)
                    # Kept after the answer; the gate waits for it (the next operation sees it).
                    ctx.gate.release_after(
                        ctx.detached.settle(run.keep_end(result), name=f"operation-{opened.kind}-end")
                    )
            # Refresh the cache so the state endpoint (and the reconciler) see the outcome now.
            await ctx.refresh(run.answering(run.members))
            return result

    if wait:
        return await whole()
    task = ctx.detached.spawn(whole(), name=f"operation-{opened.kind}")
    waiting: list[asyncio.Future[Any]] = [begun, task]
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not begun.done():  # refused before it began (the gate, no members): the caller hears why
        begun.cancel()
        return task.result()
    task.add_done_callback(log_failure)
    return begun.result().snapshot()


async def _before_the_gate(ctx: OperationContext, steps: Steps) -> Open:
    """The pre-checks' reads, up to the operation's `Open`."""
    executor = Executor(fanout=ctx.fanout, registry=ctx.registry, metrics=ctx.metrics)
    answer: Any = None
    while True:
        effect = steps.send(answer)
        if isinstance(effect, Open):
            return effect
        if not isinstance(effect, Ask):
            steps.close()
            raise TypeError(f"{type(effect).__name__} before the operation opened")
        answer = await executor.ask(effect.step, effect.records)


async def perform(run: Run, steps: Generator[Effect, Any, T]) -> T:
    """Declared steps run on an operation the caller holds open across calls of its own (a
    broadcast session: start, each chunk, finish or abort, each one HTTP request on the session's
    `run`): their effects performed on it, their value answered, a failure raised once the steps
    have not handled it."""
    return await _perform(functools.partial(_effect, run), steps, None)


async def perform_unrecorded(
    executor: Executor, refresh: Callable[[list[WorkerRecord]], Awaitable[None]], steps: Generator[Effect, Any, T]
) -> T:
    """Declared steps that belong to no operation (the reconciler's: one worker's plan): their
    `Ask`, `Call` and `Refresh` performed on `executor`, which keeps a result on the worker and
    no record; any other effect is refused."""

    async def do(effect: Effect) -> Any:
        if isinstance(effect, Call):
            return await executor.run(effect.step, effect.records)
        if isinstance(effect, Ask):
            return await executor.ask(effect.step, effect.records)
        if isinstance(effect, Refresh):
            return await refresh(effect.records)
        raise TypeError(f"{type(effect).__name__} outside an operation")

    return await _perform(do, steps, None)


async def _perform(do: Callable[[Effect], Awaitable[Any]], steps: Generator[Effect, Any, T], answer: Any) -> T:
    """Each effect the steps yield, performed by `do`; a failure thrown back into them where it happened."""
    failure: BaseException | None = None
    while True:
        try:
            effect = steps.throw(failure) if failure is not None else steps.send(answer)
        except StopIteration as done:
            value: T = done.value  # what the generator returned
            return value
        failure, answer = None, None
        try:
            answer = await do(effect)
        except BaseException as exc:  # noqa: BLE001 -- thrown into the steps, which re-raise it unless they handle it
            failure = exc


async def _effect(run: Run, effect: Effect) -> Any:
    ctx = run.ctx
    if isinstance(effect, Call):
        return await run.steps.run(effect.step, effect.records)
    if isinstance(effect, Begin):
        target = effect.disk_weights
        return await run.begin(disk_weights=None if target is None else (target.version, target.source))
    if isinstance(effect, Write):
        return await effect.change
    if isinstance(effect, Ask):
        return await run.steps.ask(effect.step, effect.records)
    if isinstance(effect, PublishFence):
        return await run.publish_fence()
    if isinstance(effect, Refresh):
        return await ctx.refresh(effect.records)
    if isinstance(effect, Together):
        do = functools.partial(_effect, run)
        return list(await asyncio.gather(*(_perform(do, part, None) for part in effect.parts)))
    raise TypeError(f"{type(effect).__name__} once the operation is open")

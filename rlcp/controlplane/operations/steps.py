"""Operations as declared steps, and the one executor that runs them (issue 35 item 1).

An operation is pure pre-checks, a list of `Step`s and pure decisions (verify's agreement,
the wave plan, the bubble). A `Step` (`workers/steps.py`, beside the drivers, so that a flavor
declares its own: the disk update's, `DiskWeights.update_steps`) declares what one fan-out is:
its name, the capability it needs, the call typed over that capability's Protocol, its deadline,
what in an answer is the worker's status, and what a failure does (`drop`, `abort`, `amend`).
`Executor.run` is the only code that runs one:
the fan-out (`workers/fanout.py`), each worker's result in the operation's record and on the
worker, the failure metric, the pause state a pause, resume or sleep leaves, and the answers
that are a worker's status recorded as fresh reads. The operations (`weights`, `verify`,
`pause`, `sleep`, `lora`, `broadcast`, `engine`, `caches`) and the reconciler's actions run
on it, and the checkpoint check before the gate (`ask`); only the status polls call the
fan-out themselves. SGLang's model gateway declares its workflows' steps the same way.

Retries (`retry`, a `workers.fanout.Retry`, which the fan-out applies to each worker's call): the
transport already retries an idempotent request on a transient failure (tenacity, backoff and
jitter) and never a collective one; a step's own `Retry` calls a worker again while its answer
says a later call may pass (a checkpoint not there yet), within the step's deadline, which covers
every attempt. A worker that failed an operation is retried
by the reconciler, its backoff in the rate limiter (`reconcile/ratelimit.py`).

`Executor.ask` runs a read before any operation exists (a pre-check: the checkpoint check),
with the same fan-out, typing and retries, and records nothing: nothing has happened yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rlcp.controlplane.fleet.members import FleetRegistry, WorkerRecord
from rlcp.controlplane.metrics import ControllerMetrics, FailedStep
from rlcp.controlplane.operations.record import OperationLog, OperationTracker
from rlcp.controlplane.workers.capabilities import Driver
from rlcp.controlplane.workers.fanout import FanOut, Outcome
from rlcp.controlplane.workers.steps import Step
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.controller import Phase, WorkerResult

T = TypeVar("T")
P = TypeVar("P", bound=Driver)

# The phase `/v1/rl/state` shows while a step of this name runs, unless the step says another
# (a status read while waking). A step not named here leaves the phase as it was.
PHASES: dict[FailedStep, Phase] = {
    "pause": "pausing",
    "resume": "resuming",
    "update": "updating",
    "verify": "verifying",
    "sleep": "sleeping",
    "wake_up": "waking",
    "start_weight_update": "updating",
    "update_weights": "updating",
    "finish_weight_update": "updating",
}
# Steps whose success says the pause state a worker is in (a sleep pauses first).
PAUSE_STATE: dict[FailedStep, bool] = {"pause": True, "resume": False, "sleep": True}


@dataclass(frozen=True)
class StepDone(Generic[T]):
    """The records a step succeeded on, and what each of their calls answered, by worker id;
    and the HTTP status each worker that refused its call answered, by worker id."""

    ok: list[WorkerRecord]
    answers: dict[str, T | None]
    refused: dict[str, int]

    @staticmethod
    def nothing() -> StepDone[T]:
        return StepDone([], {}, {})


class StepIncomplete(Exception):
    """A step declared `abort` failed on some worker: the operation cannot go on as it was.
    Every worker's result is recorded; `done` is what succeeded (a rollback's list)."""

    def __init__(self, step: Step[Any, Any], done: StepDone[Any]) -> None:
        super().__init__(f"{step.shown_as} failed on some worker")
        self.step, self.done = step, done


class Executor:
    """Runs steps over workers and keeps their bookkeeping: one per operation (`Run.steps`),
    and one for the reconciler, which has no operation record (`tracker=None`)."""

    def __init__(
        self,
        *,
        fanout: FanOut,
        registry: FleetRegistry,
        metrics: ControllerMetrics,
        tracker: OperationTracker | None = None,
        log: OperationLog | None = None,
        begun: Callable[[], bool] | None = None,
    ) -> None:
        self._fanout, self._registry, self._metrics = fanout, registry, metrics
        self._tracker, self._log = tracker, log
        # Whether the operation's record is in the store as running: no worker is touched
        # before it is (a controller that dies mid-way must find the operation at its restart).
        self._begun = begun
        # Workers whose status an answer gave, and which nothing later in the operation changes:
        # the read before the operation answers skips them (`Run.answering`).
        self.reported: set[str] = set()

    async def run(self, step: Step[P, T], records: list[WorkerRecord]) -> StepDone[T]:
        """Run `step` on `records`; record every result; answer who succeeded and with what."""
        if self._begun is not None and not self._begun():
            raise RuntimeError(f"step {step.shown_as!r} before the operation's record was kept (Run.begin)")
        phase = step.phase or PHASES.get(step.name)
        if phase is not None and self._log is not None:
            self._log.set_phase(phase)
        outcomes = await fan_out(self._fanout, step, records)
        if step.on_failure == "amend":
            self._amend(outcomes, step.shown_as)
        elif self._tracker is not None:
            self._tracker.record(outcomes)
        leaves_paused = PAUSE_STATE.get(step.name)
        for o in outcomes:
            self._registry.record_result(o.result)
            if not o.ok:
                self._metrics.worker_failures.inc(o.worker_id, step.name)
            elif leaves_paused is not None:
                # A pause or resume the worker took is its pause state now: the state shows it
                # at once, also for a worker a later step fails and no final read refreshes.
                self._registry.note_paused(o.worker_id, leaves_paused)
        answers = {o.worker_id: o.value for o in outcomes if o.ok}
        if step.observe is not None:
            for worker_id, answer in answers.items():
                if answer is not None:
                    self.observe_status(worker_id, step.observe(answer))
        refused = {o.worker_id: o.refused_with for o in outcomes if o.refused_with is not None}
        done = StepDone([r for r in records if r.id in answers], answers, refused)
        if step.on_failure == "abort" and len(done.ok) < len(records):
            raise StepIncomplete(step, done)
        return done

    async def ask(self, step: Step[P, T], records: list[WorkerRecord]) -> list[Outcome[T]]:
        """A read before any operation exists (a pre-check): each worker's outcome, nothing
        recorded and no failure logged -- the pre-check reports what it decides."""
        return await fan_out(self._fanout, step, records, quiet=True)

    def _amend(self, outcomes: Iterable[Outcome[Any]], what: str) -> None:
        if self._tracker is None:
            return
        for o in outcomes:
            first = self._tracker.results.get(o.worker_id)
            if first is None or first.status == "ok":
                self._tracker.set_result(o.result)
            elif not o.ok:
                note = f"; then {what} failed: {o.result.message}"
                self._tracker.set_result(first.model_copy(update={"message": (first.message or "") + note}))

    def observe_status(self, worker_id: str, status: WorkerStatus | None, *, final: bool = False) -> None:
        """A worker's answer that is its status: recorded as a fresh read (the status poll skips
        it this interval). `final`: nothing later in the operation changes it, so the read
        before the operation answers skips it too."""
        if status is None:
            return
        self._registry.observe(
            Outcome(worker_id, WorkerResult(worker_id=worker_id, status="ok", phase="status"), status), reported=True
        )
        if final:
            self.reported.add(worker_id)

    def passed(self, worker_id: str, phase: str) -> None:
        """A worker's result moves on to `phase`, done in a call an earlier step made (an update
        taken in one call resumes in it): still ok, the same call's duration."""
        if self._tracker is None:
            return
        result = self._tracker.results.get(worker_id)
        if result is not None and result.status == "ok":
            result = result.model_copy(update={"phase": phase})
            self._tracker.set_result(result)
            self._registry.record_result(result)

    def report(self, results: Iterable[WorkerResult]) -> None:
        """Results found before any step ran (a checkpoint a worker cannot load), or a pure
        decision's verdict on a worker (verification): recorded as a step's would be, in the
        operation and on the worker."""
        for result in results:
            if self._tracker is not None:
                self._tracker.set_result(result)
            self._registry.record_result(result)

    def fail(self, worker_id: str, *, phase: str, code: str, message: str) -> None:
        """A pure decision found a worker wrong after its calls succeeded (its checksums
        disagree): its result in the operation becomes that failure. The worker's own last
        result stays its last call's, which succeeded."""
        if self._tracker is None:
            return
        first = self._tracker.results.get(worker_id)
        base = first or WorkerResult(worker_id=worker_id, status="error", phase=phase)
        self._tracker.set_result(
            base.model_copy(update={"status": "error", "phase": phase, "code": code, "message": message})
        )


async def fan_out(
    fanout: FanOut, step: Step[P, T], records: list[WorkerRecord], *, quiet: bool = False
) -> list[Outcome[T]]:
    """The step's call sent to each of `records` that can take it, with its retries if it has
    any, each worker's outcome (a retried worker's last answer: `Retried.settle`)."""
    drivers = [r.driver for r in records]
    if step.retry is None:
        return await fanout.each(
            drivers, step.can, step.call, phase=step.shown_as, deadline_s=step.deadline_s, quiet=quiet
        )
    retried = step.retry.around(step.call)
    outcomes = await fanout.each(
        drivers, step.can, retried, phase=step.shown_as, deadline_s=step.deadline_s, quiet=quiet
    )
    return [retried.settle(o) for o in outcomes]

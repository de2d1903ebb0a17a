"""A step declared: one call to each of a set of workers, as data (issue 35 item 1, issue 46).

A `Step` says what one fan-out is: its name (one of the metrics' closed set, and the phase text of
each worker's result), the capability it needs, the call typed over that capability's Protocol,
its deadline, what in an answer is the worker's status, and what a failure does. It lives with the
drivers so that a flavor declares its own steps (`DiskWeights.update_steps`: the disk update in
one call or in three); the operations declare theirs, and one executor runs them all
(`operations/steps.py`, `Executor`).

What a failure does (`on_failure`):
- `drop` (the default): the worker's result says why, and it is left out of what the step
  returns, so the operation's later steps do not reach it (it stays as the failure left it;
  the reconciler converges it later);
- `abort`: the operation cannot go on without every worker (a broadcast's collective calls):
  after recording, `StepIncomplete` is raised, and the operation rolls back or aborts;
- `amend`: a step that makes good an earlier failure (a pause after a failed verification,
  a broadcast's abort): a worker's first failure stays its result, this step's own failure
  added to its message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from rlcp.controlplane.metrics import FailedStep
from rlcp.controlplane.workers.capabilities import Can, Driver
from rlcp.controlplane.workers.fanout import Retry
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.controller import Phase

T = TypeVar("T")
P = TypeVar("P", bound=Driver)
OnFailure = Literal["drop", "abort", "amend"]


@dataclass(frozen=True, kw_only=True)
class Step(Generic[P, T]):
    """One call to each of a set of workers, declared.

    `name`: the metrics' label and each result's phase text, unless `label` says more (a
    broadcast chunk's number: `update_weights[3]`). `phase`: what the state shows while it
    runs, when not the name's (`operations.steps.PHASES`). `observe`: what in an answer is the
    worker's status, recorded as a fresh read (the status poll skips it this interval).
    `retry`: a `workers.fanout.Retry`, which the fan-out applies to each worker's call."""

    name: FailedStep
    can: Can[P]
    call: Callable[[P], Awaitable[T]]
    deadline_s: float
    phase: Phase | None = None
    label: str | None = None
    on_failure: OnFailure = "drop"
    observe: Callable[[T], WorkerStatus | None] | None = None
    retry: Retry | None = None

    @property
    def shown_as(self) -> str:
        return self.label or self.name


def status_answer(answer: WorkerStatus | None) -> WorkerStatus | None:
    """`observe` for a step whose answer is the worker's status."""
    return answer

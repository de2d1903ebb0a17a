"""A disk update's checkpoint, checked where each worker will read it, before anything pauses.

An update pauses its members, then loads. A checkpoint that is not loadable where a worker
reads it (a typo in the path, a copy still being written, shared storage that shows the
files a moment late) used to fail the load after the pause, leaving the worker paused and
out of service until a good update arrived -- the whole fleet, for a typo. So an update
first asks every member that can tell (`staged_update`: the agent's
`POST /v1/agent/weights/check`, which reads headers only and touches no engine), before the
desired state is persisted and before anyone is cordoned, told or paused:

- loadable on every member asked: the update goes on;
- loadable on none that answered, and no member that cannot be asked: a 422
  `checkpoint_unavailable` naming each worker's reason, with nothing touched;
- loadable on some: the others are left out of the update, each reported (phase `check`,
  its error code), untouched and serving as before; the reconciler retries them later.

A LoRA load asks the same of its adapter directory before its desired state is saved: an
adapter no worker can load would otherwise be desired for good, the reconciler retrying it.

A checkpoint not there yet (`path_unavailable`) is asked about again every `RETRY_S` until
`checkpoint_wait_s` has passed (the check step's `Retry`, run by the operations' executor);
one that resolves outside the roots (`path_forbidden`) will not fix itself and is final at once.
A member that does not answer the check is no evidence against the checkpoint: it stays in the
update, whose pause finds it as it finds it.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from rlcp.controlplane.errors import CheckpointUnavailable
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.operations.context import OperationContext
from rlcp.controlplane.operations.transaction import Ask, Effect
from rlcp.controlplane.workers.capabilities import STAGED_UPDATE, StagedUpdate, WeightsKind, has
from rlcp.controlplane.workers.fanout import Outcome, Retry
from rlcp.controlplane.workers.steps import Step
from rlcp.core.wire.controller.operations import WorkerResult

RETRY_S = 0.25
_NOT_LOADABLE = frozenset({"path_unavailable", "path_forbidden"})
_MAY_APPEAR = frozenset({"path_unavailable"})


@dataclass(frozen=True)
class CheckpointCheck:
    refused: dict[str, WorkerResult]  # worker id -> why it cannot load the checkpoint (phase `check`)
    loadable: frozenset[str]  # the workers that said they can: their pause for the update checks it again


def checking(
    ctx: OperationContext, members: list[WorkerRecord], path: str, *, field: str, kind: WeightsKind = "weights"
) -> Generator[Effect, Any, CheckpointCheck]:
    """Who cannot load `path` (a checkpoint, or an adapter: `kind`), with why, and who can;
    raises `CheckpointUnavailable` when none can. A worker that answers neither way (an agent
    too old for the check: 404) is no evidence either way. A pre-check: its one read is an `Ask`."""
    asked = [r for r in members if r.reachable and has(r.driver, "staged_update")]
    if not asked:
        return CheckpointCheck({}, frozenset())
    outcomes: list[Outcome[None]] = yield Ask(_check_step(ctx, path, kind), asked)
    return _decide(ctx, members, outcomes, path, field=field, kind=kind)


def _check_step(ctx: OperationContext, path: str, kind: WeightsKind) -> Step[StagedUpdate, None]:
    d = ctx.deadlines
    return Step(
        name="check",
        can=STAGED_UPDATE,
        call=lambda w: w.check_weights(path, kind),
        # Every attempt's: the last one may begin just before the wait is over.
        deadline_s=d.checkpoint_wait_s + RETRY_S + d.control_s,
        retry=Retry(codes=_MAY_APPEAR, wait_s=RETRY_S, within_s=d.checkpoint_wait_s),
    )


def _decide(
    ctx: OperationContext,
    members: list[WorkerRecord],
    outcomes: list[Outcome[None]],
    path: str,
    *,
    field: str,
    kind: WeightsKind,
) -> CheckpointCheck:
    latest = {o.worker_id: o.result for o in outcomes}
    refused = {worker_id: result for worker_id, result in latest.items() if result.code in _NOT_LOADABLE}
    loadable = [worker_id for worker_id, result in latest.items() if result.status == "ok"]
    unasked = [r for r in members if not has(r.driver, "staged_update")]
    if refused and not loadable and not unasked:
        reasons = {worker_id: result.message or result.code or "" for worker_id, result in sorted(refused.items())}
        first_id, first_reason = next(iter(reasons.items()))
        what = "adapter" if kind == "adapter" else "checkpoint"
        raise CheckpointUnavailable(
            f"{field}: no worker can load the {what} at {path!r} (looked for {ctx.deadlines.checkpoint_wait_s:g}s); "
            f"nothing was touched. {first_id}: {first_reason}",
            field=field,
            workers=reasons,
        )
    return CheckpointCheck(refused, frozenset(loadable))

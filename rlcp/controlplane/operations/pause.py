"""Pause (abort | wait | keep) and resume the fleet, or the members a label selector names; the
desired state records which, so a worker that joins or restarts is brought to it by the reconciler.

The rule for a selector (docs/controller.md, "Selectors"):
- pause without one pauses every member (`desired.paused`); resume without one resumes every
  member and releases every hold;
- pause with one pauses only the matching members and *holds* them (`desired.held`, by worker
  id): the reconciler keeps them paused, the rest keep following `desired.paused`, and a weight
  update updates them but leaves them paused;
- resume with one releases and resumes only the matching members. While the whole fleet is
  paused it is refused (409): "all paused but these" is not a state the controller keeps, so
  it would be undone at the next reconcile.
A selector that is malformed (422) or matches no member (422) is refused before any worker is
touched or anything is written.
"""

from __future__ import annotations

from collections.abc import Callable

from rlcp.controlplane.errors import Conflict, InvalidInput
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.select import read_selector, selected
from rlcp.controlplane.operations.context import OperationContext, Run
from rlcp.controlplane.operations.transaction import Begin, Call, Open, PublishFence, Steps, Write, run_operation
from rlcp.controlplane.workers.capabilities import CONTROL
from rlcp.controlplane.workers.steps import Step
from rlcp.core.labels import Selector
from rlcp.core.wire.controller import OperationResult, PauseRequest, ResumeRequest


def _targets(records: list[WorkerRecord], selector: Selector) -> list[WorkerRecord]:
    """The matching members; none is a 422 naming `selector` (an empty fleet is left to `Run`: 503)."""
    chosen = selected(records, selector)
    if records and not chosen:
        raise InvalidInput(f"selector {selector.text!r} matches none of the {len(records)} members", field="selector")
    return chosen


def _scope(selector: Selector | None) -> Callable[[list[WorkerRecord]], list[WorkerRecord]] | None:
    """The members an operation with this selector is about (all, without one)."""
    if selector is None:
        return None
    return lambda records: _targets(records, selector)


async def pause(ctx: OperationContext, req: PauseRequest) -> OperationResult:
    return await run_operation(ctx, pausing(ctx, req))


def pausing(ctx: OperationContext, req: PauseRequest) -> Steps:
    """A pause's steps: the selector checked, open, begin, the target (the fleet paused, or the
    selected members held), the pause, the fence published."""
    selector = read_selector(req.selector)
    if selector is not None:
        _targets(ctx.registry.members(), selector)  # refused before the gate and the log
    deadline = ctx.deadlines.pause(req.timeout_s)
    step = Step(
        name="pause",
        can=CONTROL,
        call=lambda w: w.pause(req.mode, deadline),
        deadline_s=ctx.deadlines.call_over(deadline),
    )
    detail: dict[str, object] = {"mode": req.mode} | ({"selector": req.selector} if selector else {})
    run: Run = yield Open("pause", detail, _scope(selector))
    yield Begin()
    if selector is None:
        yield Write(ctx.desired.set_paused(True, req.mode))
    else:
        run.tracker.note(workers=[r.id for r in run.members])
        yield Write(ctx.desired.hold([r.id for r in run.members], req.mode))
    yield Call(step, run.members)
    # A data plane with its own copy of the fence (Envoy) stops routing to them before the
    # caller hears "paused" (what it routed meanwhile is held, or aborted, by the pause).
    yield PublishFence()


async def resume(ctx: OperationContext, req: ResumeRequest | None = None) -> OperationResult:
    return await run_operation(ctx, resuming(ctx, req))


def resuming(ctx: OperationContext, req: ResumeRequest | None) -> Steps:
    """A resume's steps: as a pause's, the other way."""
    selector = read_selector(req.selector if req is not None else None)
    if selector is not None:
        if ctx.desired.state.paused:
            raise Conflict(
                "the whole fleet is paused: resume it without a selector, then pause the members to keep "
                "paused with one"
            )
        _targets(ctx.registry.members(), selector)
    step = Step(name="resume", can=CONTROL, call=lambda w: w.resume(), deadline_s=ctx.deadlines.control_s)
    detail = {"selector": req.selector} if req is not None and selector else {}
    run: Run = yield Open("resume", detail, _scope(selector))
    yield Begin()
    if selector is None:
        yield Write(ctx.desired.set_paused(False))
    else:
        run.tracker.note(workers=[r.id for r in run.members])
        yield Write(ctx.desired.release([r.id for r in run.members]))
    yield Call(step, run.members)
    yield PublishFence()  # and routes to them again before the caller hears "resumed"

"""Pause (abort | wait | keep) and resume the whole fleet; the desired state records which,
so a worker that joins or restarts is brought to it by the reconciler."""

from __future__ import annotations

from rlcp.controlplane.operations.context import OperationContext, Run, run_operation
from rlcp.controlplane.workers.capabilities import CONTROL
from rlcp.core.wire.controller import OperationResult, PauseRequest


async def pause(ctx: OperationContext, req: PauseRequest) -> OperationResult:
    async def body(run: Run) -> None:
        deadline = ctx.deadlines.pause(req.timeout_s)
        await ctx.desired.set_paused(True, req.mode)
        await run.step("pausing", "pause", run.members, CONTROL, lambda w: w.pause(req.mode, deadline),
                       ctx.deadlines.call_over(deadline))

    return await run_operation(ctx, "pause", {"mode": req.mode}, body)


async def resume(ctx: OperationContext) -> OperationResult:
    async def body(run: Run) -> None:
        await ctx.desired.set_paused(False)
        await run.step("resuming", "resume", run.members, CONTROL, lambda w: w.resume(), ctx.deadlines.control_s)

    return await run_operation(ctx, "resume", {}, body)

"""The disk update transaction: gate -> pause(mode) -> update -> verify -> resume.

- Desired state is persisted before any worker is touched, so a controller killed
  mid-transaction converges the fleet to it after a restart.
- Workers that gate readiness on it are told the desired version first: a stale one
  reports not ready at once.
- A worker failing a step drops out of the later steps and stays paused (out of
  service, its frozen requests kept); the rest resume; the reconciler retries it.
- Verify: see `verify.py`.
Re-sending a version the fleet already has is a no-op success.
"""

from __future__ import annotations

from controlplane.fleet.paths import check_path
from controlplane.fleet.registry import WorkerRecord
from controlplane.operations.context import OperationContext, Run, require_capability, run_operation
from controlplane.operations.verify import verify
from rlcore.wire.controller import OperationResult, UpdateWeightsRequest


async def update_weights(ctx: OperationContext, req: UpdateWeightsRequest) -> OperationResult:
    path = check_path(req.source.path, "source.path", ctx.allowed_roots)
    require_capability(ctx.registry.members(), "disk_weights", "a disk weight update")
    detail = {"version": req.version, "path": path, "pause_mode": req.pause_mode, "verify": req.verify}
    d = ctx.deadlines

    async def body(run: Run) -> None:
        pause_s, load_s = d.pause(req.timeout_s), d.load(req.timeout_s)
        members = run.members
        if ctx.desired.state.weight_version == req.version:
            # Read fresh: the cache may predate a worker's restart onto base weights.
            await ctx.refresh(members)
        already = [r for r in members if r.reachable and r.status is not None
                   and r.status.weight_version == req.version]
        if ctx.desired.state.weight_version == req.version and len(already) == len(members):
            for r in members:
                run.tracker.skip(r.id, "gate", f"already at version {req.version!r}")
            run.tracker.note(noop=True)
            return
        ctx.log.set_verified(False)
        await ctx.desired.set_disk_weights(req.version, req.source.model_copy(update={"path": path}))
        await tell_desired(run, [r for r in members if r.tracks_desired], req.version)

        paused = await run.step("pausing", "pause", members, lambda a: a.pause(req.pause_mode, pause_s),
                                d.call_over(pause_s))
        updated = await run.step("updating", "update", paused,
                                 lambda a: a.update_weights_from_disk(path, req.version), d.call_over(load_s))
        verified = await verify(run, updated, req.version) if req.verify else updated
        ctx.log.set_verified(req.verify and len(verified) == len(members))
        if not ctx.desired.state.paused:
            await run.step("resuming", "resume", verified, lambda a: a.resume(), d.control_s)

    return await run_operation(ctx, "update_weights", detail, body)


async def tell_desired(run: Run, records: list[WorkerRecord], version: str | None) -> None:
    """Tell workers that gate their readiness on it the desired version."""
    told = await run.step(None, "set_desired", records, lambda a: a.set_desired_version(version),
                          run.ctx.deadlines.control_s)
    for r in told:
        run.ctx.registry.told(r.id, version)

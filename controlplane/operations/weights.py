"""The disk update transaction: gate -> pause(mode) -> update -> verify -> resume.

- Desired state is persisted before any worker is touched, so a controller killed
  mid-transaction converges the fleet to it after a restart.
- Workers that gate readiness on it are told the desired version first: a stale one
  reports not ready at once.
- A worker failing a step drops out of the later steps and stays paused (out of
  service, its frozen requests kept); the rest resume; the reconciler retries it.
- Verify: see `verify.py`.
- Round trips: a worker with the `staged_update` capability (the agent) takes three calls,
  each answering what would otherwise be a read of its own: prepare (told the desired
  version, then paused), load (answering its version and checksums), resume (answering its
  status, so the final read skips it). Others compose what their engine offers: tell
  desired, pause, load, version read, checksums, resume, final read.
Re-sending a version the fleet already has is a no-op success.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from controlplane.fleet.paths import check_path
from controlplane.fleet.registry import WorkerRecord
from controlplane.operations.context import OperationContext, Run, require_capability, run_operation
from controlplane.operations.verify import verify
from controlplane.workers.capabilities import LoadReport, has
from controlplane.workers.fanout import Outcome
from rlcore.wire.controller import OperationResult, UpdateWeightsRequest, WorkerResult


async def update_weights(ctx: OperationContext, req: UpdateWeightsRequest) -> OperationResult:
    path = check_path(req.source.path, "source.path", ctx.allowed_roots)
    require_capability(ctx.registry.members(), "disk_weights", "a disk weight update")
    detail = {"version": req.version, "path": path, "pause_mode": req.pause_mode, "verify": req.verify}
    d = ctx.deadlines

    async def body(run: Run) -> None:
        pause_s = d.pause(req.timeout_s)
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
        staged = {r.id for r in members if has(r.driver, "staged_update")}
        await tell_desired(run, [r for r in members if r.tracks_desired and r.id not in staged], req.version)

        def pause(a: Any) -> Awaitable[None]:  # a driver
            if a.spec.id in staged:
                return a.prepare_update(req.version, req.pause_mode, pause_s)
            return a.pause(req.pause_mode, pause_s)

        paused = await run.step("pausing", "pause", members, pause, d.call_over(pause_s))
        for r in paused:
            if r.id in staged:
                ctx.registry.told(r.id, req.version)

        def load(a: Any) -> Awaitable[Any]:
            if a.spec.id in staged:
                return a.load_reporting(path, req.version, checksums=req.verify)
            return a.update_weights_from_disk(path, req.version)

        # Hashing time is allowed only where a load answers checksums (a staged worker's).
        updated, answers = await run.step_values("updating", "update", paused, load,
                                                 d.staged_load(req.timeout_s, checksums=req.verify and bool(staged)))
        reports = {wid: a for wid, a in answers.items() if isinstance(a, LoadReport)}
        verified = await verify(run, updated, req.version, reports) if req.verify else updated
        ctx.log.set_verified(req.verify and len(verified) == len(members))
        if not ctx.desired.state.paused:
            await resume(run, verified, staged)

    return await run_operation(ctx, "update_weights", detail, body)


async def resume(run: Run, records: list[WorkerRecord], staged: set[str]) -> None:
    """Resume `records`; a staged worker's answer is its status, recorded as a fresh read."""
    def call(a: Any) -> Awaitable[Any]:
        return a.resume_reporting() if a.spec.id in staged else a.resume()

    _, answers = await run.step_values("resuming", "resume", records, call, run.ctx.deadlines.control_s)
    for worker_id in staged & answers.keys():
        run.ctx.registry.observe(Outcome(worker_id, WorkerResult(worker_id=worker_id, status="ok", phase="status"),
                                         answers[worker_id]))
        run.reported.add(worker_id)


async def tell_desired(run: Run, records: list[WorkerRecord], version: str | None) -> None:
    """Tell workers that gate their readiness on it the desired version."""
    told = await run.step(None, "set_desired", records, lambda a: a.set_desired_version(version),
                          run.ctx.deadlines.control_s)
    for r in told:
        run.ctx.registry.told(r.id, version)

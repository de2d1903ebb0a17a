"""The disk update transaction: gate -> cordon -> pause(mode) -> update -> verify -> resume.

- Desired state is persisted before any worker is touched, so a controller killed
  mid-transaction converges the fleet to it after a restart.
- Strategy: `all_at_once` takes the whole fleet through the steps together; `rolling` takes
  waves of at most `max_unavailable` members, one after the other, while the rest keep
  serving -- at their old version, as long as the gateway's staleness bound admits it. A
  wave is cordoned first (out of the gateway's serving set before it is paused), and
  returned once updated, verified and resumed.
- A worker failing a step drops out of the later steps and stays paused (out of service, its
  frozen requests kept); the rest resume; the reconciler retries it. A rolling update stops
  after a wave in which any worker failed: the members not reached yet are left as they
  were, serving (a bad checkpoint costs one wave, not the fleet).
- Verify: see `verify.py`. Later waves are held to what the earlier ones agreed on.
- Steps: one call per worker each, the driver's (`DiskWeights`): `pause_for_update` (told the
  desired version where the worker gates readiness on it, then paused), `load_from_disk`,
  `resume_after_update`. How a flavor composes them is its own: the agent answers each with
  what would otherwise be a read (its status; its version and checksums), so verification
  uses the load's answer and the final read skips it; stock vLLM and Dynamo send separate
  calls that answer nothing, and are read afterwards (version, checksums, final status).
- The bubble (`bubble.py`): each member's time out of service and the fleet's serving
  capacity, in the operation's record and the state document.
Re-sending a version the fleet already has is a no-op success.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.paths import check_path
from rlcp.controlplane.operations.bubble import BubbleRecorder, resolve_max_unavailable, waves
from rlcp.controlplane.operations.checkpoint import check_checkpoint
from rlcp.controlplane.operations.context import OperationContext, Run, require_capability, run_operation
from rlcp.controlplane.operations.verify import Agreement, verify
from rlcp.controlplane.workers.capabilities import DISK_WEIGHTS, DiskWeights, capable
from rlcp.controlplane.workers.fanout import Outcome
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.controller import OperationResult, Rolling, RollProgress, UpdateWeightsRequest, WorkerResult


async def update_weights(ctx: OperationContext, req: UpdateWeightsRequest) -> OperationResult:
    path = check_path(req.source.path, "source.path", ctx.allowed_roots)
    asleep = ctx.desired.state.asleep
    members = [r for r in ctx.registry.members() if r.id not in asleep]  # the asleep: skipped (`Run`)
    require_capability(members, "disk_weights", "a disk weight update")
    detail = {"version": req.version, "path": path, "pause_mode": req.pause_mode, "verify": req.verify,
              "strategy": req.strategy.model_dump()}
    if req.expected_checksums is not None:
        require_capability(members, "checksums", "checking weights against a manifest")
        detail["manifest_tensors"] = len(req.expected_checksums)
    # Before the gate, the desired state, a cordon or a pause: a checkpoint no worker can load
    # is a 422 with nothing touched; one some cannot load leaves those out (checkpoint.py).
    check = await check_checkpoint(ctx, members, path, field="source.path")
    refused = check.refused
    if refused:
        detail["checkpoint_refused"] = sorted(refused)

    async def body(run: Run) -> None:
        run.report(refused.values())
        members = [r for r in run.members if r.id not in refused]
        if not members:
            return
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
        serving_before = {r.id for r in members if serving(r)}
        bubble = run.tracker.bubble = BubbleRecorder([r.id for r in members], serving_before)
        await ctx.desired.set_disk_weights(req.version, req.source.model_copy(update={"path": path}))
        d = ctx.desired.state
        # Members the fence stops admitting now (every other version, at staleness 0) leave service.
        admitted = admitted_versions(d.weight_version, d.applied_versions, d.staleness_bound)
        bubble.out(r.id for r in members if r.status is None or r.status.weight_version not in admitted)
        size = len(members)
        if isinstance(req.strategy, Rolling):
            size = resolve_max_unavailable(req.strategy.max_unavailable, len(members))
        await Roll(run, req, path, size, serving_before, members, check.loadable).execute()

    return await run_operation(ctx, "update_weights", detail, body, wait=req.wait)


def serving(rec: WorkerRecord) -> bool:
    """In service as far as the controller knows: reachable, running, not cordoned."""
    s = rec.status
    return rec.reachable and not rec.cordoned and s is not None and s.paused is False and s.engine_alive is not False


@dataclass
class Roll:
    """The waves of one update (a single wave of every member, all at once).

    Members already out of service when it began (unreachable, paused, engine dead) go first,
    in one wave of their own: updating them costs no capacity. Their failures do not stop the
    roll -- a dead pod is no evidence against the checkpoint; a serving member's failure is."""

    run: Run
    req: UpdateWeightsRequest
    path: str
    size: int
    serving_before: set[str]
    members: list[WorkerRecord]  # the operation's, less those that cannot load the checkpoint
    checked: frozenset[str]  # said they can load it: their pause for the update checks it again

    def plan(self, ids: list[str]) -> list[list[str]]:
        if self.size >= len(ids):
            return [ids]
        idle = [i for i in ids if i not in self.serving_before]
        return ([idle] if idle else []) + waves([i for i in ids if i in self.serving_before], self.size)

    async def execute(self) -> None:
        run, req = self.run, self.req
        ctx = run.ctx
        by_id = {r.id: r for r in self.members}
        plan = self.plan(list(by_id))
        bubble = run.tracker.bubble
        assert bubble is not None
        agreement = Agreement()
        progress = RollProgress(strategy=req.strategy.type, max_unavailable=self.size, waves=len(plan), waves_done=0,
                                wave=[], updated=0, failed=0)
        for i, wave_ids in enumerate(plan):
            progress = progress.model_copy(update={"wave": wave_ids})
            run.tracker.set_progress(progress)
            ctx.registry.cordon(wave_ids)
            bubble.out(wave_ids)
            try:
                # A data plane with its own copy of the fence (Envoy) has this one before any pause.
                await run.publish_fence()
                verified, resumed = await self.wave([by_id[w] for w in wave_ids], agreement)
            finally:
                ctx.registry.cordon(wave_ids, False)
            # And has it widened before the next wave narrows it (or the trainer hears "done"): a
            # wave cordoned while Envoy has not yet taken back the last one would leave nobody serving.
            await run.publish_fence()
            bubble.back(r.id for r in resumed)
            done = {r.id for r in verified}
            failed = [w for w in wave_ids if w not in done]
            progress = progress.model_copy(update={"waves_done": i + 1, "wave": [],
                                                   "updated": progress.updated + len(verified),
                                                   "failed": progress.failed + len(failed)})
            rest = [w for later in plan[i + 1:] for w in later]
            if rest and any(w in self.serving_before for w in failed):
                why = (f"wave {i + 1} of {len(plan)} failed on {', '.join(failed)}: the roll stopped, and "
                       f"{len(rest)} member(s) were left as they were")
                for worker_id in rest:
                    run.tracker.skip(worker_id, "update", f"not updated: {why}")
                progress = progress.model_copy(update={"halted": why})
                break
        run.tracker.set_progress(progress)
        ctx.log.set_verified(req.verify and progress.updated == len(run.members))  # the refused too

    async def wave(self, records: list[WorkerRecord], agreement: Agreement) -> tuple[list[WorkerRecord],
                                                                                    list[WorkerRecord]]:
        """Take one wave through the steps: (verified, resumed)."""
        run, req = self.run, self.req
        ctx, d = run.ctx, run.ctx.deadlines
        pause_s = d.pause(req.timeout_s)

        def pause(w: DiskWeights) -> Awaitable[WorkerStatus | None]:
            # A worker that said it can load the checkpoint checks it again as it pauses.
            return w.pause_for_update(req.version, req.pause_mode, pause_s,
                                      weights_path=self.path if w.spec.id in self.checked else None)

        paused = await run.step_values("pausing", "pause", records, DISK_WEIGHTS, pause, d.call_over(pause_s))
        for r in paused.ok:
            if r.tracks_desired:
                ctx.registry.told(r.id, req.version)
            report_status(run, r.id, paused.answers.get(r.id))

        # Hashing time is allowed only in a wave where a load answers checksums.
        hashing = req.verify and any(w.loads_with_checksums for w in capable((r.driver for r in records), DISK_WEIGHTS))
        loaded = await run.step_values(
            "updating", "update", paused.ok, DISK_WEIGHTS,
            lambda w: w.load_from_disk(self.path, req.version, checksums=req.verify),
            d.load_step(req.timeout_s, checksums=hashing))
        reports = {worker_id: report for worker_id, report in loaded.answers.items() if report is not None}
        updated = verified = loaded.ok
        if req.verify:
            verified = await verify(run, updated, req.version, reports, manifest=req.expected_checksums,
                                    agreement=agreement)
        if ctx.desired.state.paused:  # an operator paused the fleet: the update leaves it paused
            return verified, []
        # A member an operator holds paused (a selector-scoped pause) is updated but stays paused.
        return verified, await resume(run, [r for r in verified if r.id not in ctx.desired.state.held])


async def resume(run: Run, records: list[WorkerRecord]) -> list[WorkerRecord]:
    """Resume `records`; a status a worker answers with is recorded as a fresh read."""
    resumed = await run.step_values("resuming", "resume", records, DISK_WEIGHTS,
                                    lambda w: w.resume_after_update(), run.ctx.deadlines.control_s)
    for worker_id, status in resumed.answers.items():
        if status is not None:
            report_status(run, worker_id, status)
            run.reported.add(worker_id)
    return resumed.ok


def report_status(run: Run, worker_id: str, status: WorkerStatus | None) -> None:
    """A worker's answer that is its status: recorded as a fresh read (so the status poll
    skips it this interval)."""
    if status is not None:
        run.ctx.registry.observe(Outcome(worker_id, WorkerResult(worker_id=worker_id, status="ok", phase="status"),
                                         status), reported=True)

"""The disk update transaction: gate -> cordon -> pause(mode) -> update -> verify -> resume.

- Desired state is persisted before any worker is touched, so a controller killed
  mid-transaction converges the fleet to it after a restart; the operation's record (running)
  goes in the same write, so the restart also lists the update as interrupted.
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
- Each member's driver declares its flavor's steps (`update_steps`, `workers/updates.py`); a
  wave runs each declaration on the members that made it, side by side (`Roll.wave`).
- Round trips per worker (issue 35), verify on: a worker that takes the update in one call
  (`StagedUpdate`, the agent) is asked before anyone pauses whether it can load the checkpoint
  (`checkpoint.py`), then sent `update_in_one_call` -- told the version, paused, loaded, hashed,
  and resumed in the same call unless the fleet stays paused or an operator holds it; held to
  the checksums already agreed on (a manifest, or the earlier waves') where there are any: 2.
  The others take `DiskWeights`' steps: `pause_for_update`, `load_from_disk` (stock vLLM: the
  reload, then the version named, the prefix cache dropped and the checksums taken at once,
  answering version and checksums), `resume_after_update`: at most 6 requests in 4 rounds.
  No status is read afterwards: every answer that says what a worker became is recorded as a
  fresh read, and a worker whose resume answers nothing is known from its load's answer.
- A worker that resumed in its call and then fails verification (a first wave without a
  manifest: nothing to hold it to in the call) is paused again before the wave is uncordoned,
  so it never entered the fence; requests its pause froze (keep mode) ran on those weights in
  between. One whose second pause fails stays cordoned.
- The bubble (`bubble.py`): each member's time out of service and the fleet's serving
  capacity, in the operation's record and the state document.
Re-sending a version the fleet already has is a no-op success.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.paths import check_path
from rlcp.controlplane.operations.bubble import BubbleRecorder, resolve_max_unavailable, waves
from rlcp.controlplane.operations.checkpoint import checking
from rlcp.controlplane.operations.context import OperationContext, Run, operating_on, require_capability
from rlcp.controlplane.operations.steps import StepDone
from rlcp.controlplane.operations.transaction import (
    Begin,
    Call,
    DiskTarget,
    Effect,
    Open,
    PublishFence,
    Refresh,
    Steps,
    Together,
    run_operation,
)
from rlcp.controlplane.operations.verify import Agreement, verify
from rlcp.controlplane.workers.capabilities import CONTROL, DISK_WEIGHTS, LoadReport, UpdateReport, capable
from rlcp.controlplane.workers.fanout import Outcome
from rlcp.controlplane.workers.steps import Step
from rlcp.controlplane.workers.updates import UPDATE_STEPS, DeclaredUpdate, UpdateSteps, WaveUpdate
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.controller import OperationResult, Rolling, RollProgress, UpdateWeightsRequest

T = TypeVar("T")


async def update_weights(ctx: OperationContext, req: UpdateWeightsRequest) -> OperationResult:
    return await run_operation(ctx, disk_update(ctx, req), wait=req.wait)


def disk_update(ctx: OperationContext, req: UpdateWeightsRequest) -> Steps:
    """The update's steps, declared: pre-checks and the checkpoint check, open, the no-op gate,
    begin (with the new target), then the waves (`Roll`)."""
    path = check_path(req.source.path, "source.path", ctx.allowed_roots)
    members = operating_on(ctx, "update_weights")  # the asleep left out, as `Run` leaves them
    require_capability(members, "disk_weights", "a disk weight update")
    detail = {
        "version": req.version,
        "path": path,
        "pause_mode": req.pause_mode,
        "verify": req.verify,
        "strategy": req.strategy.model_dump(),
    }
    if req.expected_checksums is not None:
        require_capability(members, "checksums", "checking weights against a manifest")
        detail["manifest_tensors"] = len(req.expected_checksums)
    # Before the gate, the desired state, a cordon or a pause: a checkpoint no worker can load
    # is a 422 with nothing touched; one some cannot load leaves those out (checkpoint.py).
    check = yield from checking(ctx, members, path, field="source.path")
    refused = check.refused
    if refused:
        detail["checkpoint_refused"] = sorted(refused)
    run: Run = yield Open("update_weights", detail)
    run.steps.report(refused.values())
    members = [r for r in run.members if r.id not in refused]
    if not members:
        return
    if ctx.desired.state.weight_version == req.version:
        # Read fresh: the cache may predate a worker's restart onto base weights.
        yield Refresh(members)
    already = [r for r in members if r.reachable and r.status is not None and r.status.weight_version == req.version]
    if ctx.desired.state.weight_version == req.version and len(already) == len(members):
        for r in members:
            run.tracker.skip(r.id, "gate", f"already at version {req.version!r}")
        run.tracker.note(noop=True)
        return
    ctx.log.set_verified(False)
    serving_before = {r.id for r in members if serving(r)}
    bubble = run.tracker.measure_bubble([r.id for r in members], serving_before)
    # The new target and the record (running) in one write, before anyone is paused: a
    # controller killed from here on restarts converging to this version and lists this
    # update as interrupted.
    yield Begin(DiskTarget(req.version, req.source.model_copy(update={"path": path})))
    d = ctx.desired.state
    # Members the fence stops admitting now (every other version, at staleness 0) leave service.
    admitted = admitted_versions(d.weight_version, d.applied_versions, d.staleness_bound)
    bubble.out(r.id for r in members if r.status is None or r.status.weight_version not in admitted)
    size = len(members)
    if isinstance(req.strategy, Rolling):
        size = resolve_max_unavailable(req.strategy.max_unavailable, len(members))
    yield from Roll(
        run=run, req=req, path=path, size=size, serving_before=serving_before, members=members, bubble=bubble
    ).execute()


def serving(rec: WorkerRecord) -> bool:
    """In service as far as the controller knows: reachable, running, not cordoned."""
    s = rec.status
    return rec.reachable and not rec.cordoned and s is not None and s.paused is False and s.engine_alive is not False


@dataclass(kw_only=True)
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
    bubble: BubbleRecorder  # the record's (`tracker.measure_bubble`), which reports it

    def plan(self, ids: list[str]) -> list[list[str]]:
        if self.size >= len(ids):
            return [ids]
        idle = [i for i in ids if i not in self.serving_before]
        return ([idle] if idle else []) + waves([i for i in ids if i in self.serving_before], self.size)

    def execute(self) -> Generator[Effect, Any, None]:
        run, req = self.run, self.req
        ctx = run.ctx
        by_id = {r.id: r for r in self.members}
        plan = self.plan(list(by_id))
        bubble = self.bubble
        agreement = Agreement()
        progress = RollProgress(
            strategy=req.strategy.type,
            max_unavailable=self.size,
            waves=len(plan),
            waves_done=0,
            wave=[],
            updated=0,
            failed=0,
        )
        for i, wave_ids in enumerate(plan):
            progress = progress.model_copy(update={"wave": wave_ids})
            run.tracker.set_progress(progress)
            ctx.registry.cordon(wave_ids)
            bubble.out(wave_ids)
            still_out: set[str] = set()
            try:
                # A data plane with its own copy of the fence (Envoy) has this one before any pause.
                yield PublishFence()
                done_wave = yield from self.wave([by_id[w] for w in wave_ids], agreement)
                verified, resumed, still_out = done_wave.verified, done_wave.resumed, done_wave.still_out
            finally:
                ctx.registry.cordon([w for w in wave_ids if w not in still_out], False)
            # And has it widened before the next wave narrows it (or the trainer hears "done"): a
            # wave cordoned while Envoy has not yet taken back the last one would leave nobody serving.
            yield PublishFence()
            bubble.back(r.id for r in resumed)
            done = {r.id for r in verified}
            failed = [w for w in wave_ids if w not in done]
            progress = progress.model_copy(
                update={
                    "waves_done": i + 1,
                    "wave": [],
                    "updated": progress.updated + len(verified),
                    "failed": progress.failed + len(failed),
                }
            )
            rest = [w for later in plan[i + 1 :] for w in later]
            if rest and any(w in self.serving_before for w in failed):
                why = (
                    f"wave {i + 1} of {len(plan)} failed on {', '.join(failed)}: the roll stopped, and "
                    f"{len(rest)} member(s) were left as they were"
                )
                for worker_id in rest:
                    run.tracker.skip(worker_id, "update", f"not updated: {why}")
                progress = progress.model_copy(update={"halted": why})
                break
        run.tracker.set_progress(progress)
        ctx.log.set_verified(req.verify and progress.updated == len(run.members))  # the refused too

    def wave(self, records: list[WorkerRecord], agreement: Agreement) -> Generator[Effect, Any, Wave]:
        """Take one wave through the steps each member's driver declares (`update_steps`: the
        agent's one call, the others' pause and load), side by side; verify them together on
        what the steps answered; pause again a worker that resumed in its call and then failed
        verification (the wave stays cordoned, out of the fence, until that is done); resume the
        rest that passed, unless the fleet stays paused or an operator holds the worker."""
        run, req, state = self.run, self.req, self.run.ctx.desired.state
        leave_paused, held = state.paused, state.held  # an operator's pause: updated, not resumed
        update = self._update(agreement)
        declared = declarations(records, update)
        done: list[StepDone[UpdateReport]] = yield Together(tuple(self._load(s, group) for s, group in declared))
        for (steps, group), loaded in zip(declared, done, strict=True):
            if steps.uncertain:
                yield from self._after_failures(group, loaded)
        answers = {worker_id: a for d in done for worker_id, a in d.answers.items() if a is not None}
        reports = {worker_id: a.load for worker_id, a in answers.items() if a.load is not None}
        verified = [r for d in done for r in d.ok]
        if req.verify:
            verified = yield from verify(
                run, verified, req.version, reports, manifest=req.expected_checksums, agreement=agreement
            )
        resumed_in_call = {worker_id for worker_id, a in answers.items() if a.resumed}
        passed = {r.id for r in verified}
        relapsed = [r for d in done for r in d.ok if r.id in resumed_in_call and r.id not in passed]
        still_out = yield from self._pause_again(relapsed, update.pause_s)
        for r in verified:
            if r.id in resumed_in_call:
                # Back in service in its own call: what a resume step would have recorded.
                run.steps.observe_status(r.id, answers[r.id].status, final=True)
                run.steps.passed(r.id, "resume")
        if leave_paused:
            return Wave(verified, [], still_out)
        resumed = yield from resume(
            run, [r for r in verified if r.id not in held and r.id not in resumed_in_call], reports
        )
        return Wave(verified, [*resumed, *(r for r in verified if r.id in resumed_in_call)], still_out)

    def _update(self, agreement: Agreement) -> WaveUpdate:
        """What this wave asks of every member: a worker resumes in its own call unless the fleet
        stays paused or a selector-scoped pause holds it, and is held to the checksums agreed on
        (a manifest, the earlier waves')."""
        req, ctx = self.req, self.run.ctx
        state = ctx.desired.state
        return WaveUpdate(
            path=self.path,
            version=req.version,
            mode=req.pause_mode,
            pause_s=ctx.deadlines.pause(req.timeout_s),
            requested_s=req.timeout_s,
            checksums=req.verify,
            expected_checksums=(agreement.checksums or req.expected_checksums) if req.verify else None,
            resumes=lambda worker_id: not state.paused and worker_id not in state.held,
            deadlines=ctx.deadlines,
        )

    def _load(self, steps: UpdateSteps, records: list[WorkerRecord]) -> Generator[Effect, Any, StepDone[UpdateReport]]:
        """One declaration's steps on the members that made it, up to the load. A worker knows
        the new version once its first step succeeded (where it tracks the desired one)."""
        if steps.pause is not None:
            paused: StepDone[WorkerStatus | None] = yield Call(steps.pause, records)
            self._told(paused.ok)
            records = paused.ok
        loaded: StepDone[UpdateReport] = yield Call(steps.update, records)
        if steps.pause is None:
            self._told(loaded.ok)
        return loaded

    def _told(self, records: list[WorkerRecord]) -> None:
        for r in records:
            if r.tracks_desired:
                self.run.ctx.registry.told(r.id, self.req.version)

    def _pause_again(self, relapsed: list[WorkerRecord], pause_s: float) -> Generator[Effect, Any, set[str]]:
        """Pause the workers that resumed in their call and then failed verification; answers
        those still serving (the wave stays cordoned for them)."""
        if not relapsed:
            return set()
        req, d = self.req, self.run.ctx.deadlines
        pause_again = Step(
            name="pause",
            can=CONTROL,
            call=lambda w: w.pause(req.pause_mode, pause_s),
            deadline_s=d.call_over(pause_s),
            on_failure="amend",
        )
        again: StepDone[None] = yield Call(pause_again, relapsed)
        return {r.id for r in relapsed} - {r.id for r in again.ok}

    def _after_failures(
        self, records: list[WorkerRecord], done: StepDone[UpdateReport]
    ) -> Generator[Effect, Any, None]:
        """What a failed update that pauses in the same call (`UpdateSteps.uncertain`: the
        agent's) left. A 4xx: refused before any change (the checkpoint, the gate). A 5xx: the
        agent may have learnt the version and paused before what failed (and then stays paused,
        as a failed step always left a worker); it answered, so its status is read now (one round
        trip, on the failure path only). No answer at all: unreachable (its connection failed) is
        recorded as a status read would find it; otherwise (a timeout) it may have paused, and
        counts as paused until the status poll reads it, so nothing routes to it on a guess -- a
        read now would make the trainer wait a status deadline for a worker that did not answer
        the call either. A 5xx is not counted as told: it may come from a proxy the call never got
        past (the reconciler tells it again, which costs nothing)."""
        ctx = self.run.ctx
        answered_error: list[WorkerRecord] = []
        for r in records:
            refused = done.refused.get(r.id)
            if r.id in done.answers:
                continue
            if refused is not None and refused >= 500:
                answered_error.append(r)
            elif refused is None:
                result = self.run.tracker.results.get(r.id)
                if result is not None and result.code == "unreachable":
                    # Its connection failed (killed, say): what a status read would find now.
                    ctx.registry.observe(Outcome(r.id, result))
                else:
                    ctx.registry.note_paused(r.id, True)
        if answered_error:
            yield Refresh(answered_error)


def declarations(records: list[WorkerRecord], update: WaveUpdate) -> list[tuple[UpdateSteps, list[WorkerRecord]]]:
    """The wave's members grouped by how their drivers declare the update (the same
    `update_steps`), each group with the steps its drivers declare for it."""
    groups: dict[object, list[DeclaredUpdate]] = {}
    for d in capable((r.driver for r in records), UPDATE_STEPS):
        groups.setdefault(type(d).update_steps, []).append(d)
    by_id = {r.id: r for r in records}
    return [(group[0].update_steps(update, group), [by_id[d.spec.id] for d in group]) for group in groups.values()]


@dataclass(frozen=True)
class Wave:
    verified: list[WorkerRecord]
    resumed: list[WorkerRecord]
    still_out: set[str]  # resumed in its call, failed verification, and could not be paused again: kept cordoned


def resume(
    run: Run, records: list[WorkerRecord], loaded: dict[str, LoadReport]
) -> Generator[Effect, Any, list[WorkerRecord]]:
    """Resume `records`; a status a worker answers with is recorded as a fresh read. A worker
    whose resume answers nothing (stock vLLM) but whose load answered its version is known
    without a read: its last status, at that version and running -- what the calls it answered
    ok made of it -- so the read before the operation answers skips it too; the status poll
    reads it again within its interval."""
    resuming = Step(
        name="resume", can=DISK_WEIGHTS, call=lambda w: w.resume_after_update(), deadline_s=run.ctx.deadlines.control_s
    )
    resumed: StepDone[WorkerStatus | None] = yield Call(resuming, records)
    for r in resumed.ok:
        status = resumed.answers.get(r.id)
        report = loaded.get(r.id)
        if status is None and r.status is not None and report is not None and report.weight_version is not None:
            status = r.status.model_copy(
                update={
                    "weight_version": report.weight_version,
                    "paused": False if r.status.paused is not None else None,
                }
            )
        run.steps.observe_status(r.id, status, final=True)
    return resumed.ok

"""Sleep and wake_up as fleet operations (docs/controller.md, "Sleep and wake_up"; vLLM's sleep mode, `AsyncLLM.sleep` /
`wake_up`): a member asleep has released its accelerator memory, serves nothing, and is kept
out of the gateway's fence until a wake has verified it.

Sleep (`POST /v1/rl/sleep`), for the members a selector or a list of ids names (all without):
1. the members leave the fence at once (cordoned), before anything is asked of them;
2. where the flavor computes them, their weight checksums are taken (what the wake is checked
   against) -- a member that cannot give them is not put to sleep, and returns to service;
3. the desired state records them asleep (`desired.asleep`: level, version, checksum digest),
   persisted, so a restarted controller and the reconciler keep them so;
4. each is put to sleep: the engine pauses (`mode`: abort or wait) and releases memory.
A member whose sleep failed stays recorded asleep -- a sleep that timed out may have taken
hold, and resuming an engine onto released memory is worse than keeping a member out -- and
the reconciler puts it to sleep when it answers. Other operations leave members asleep out
(`context.Run`), and a broadcast's init is refused while any is asleep.

Wake (`POST /v1/rl/wake_up`), for the named members that are asleep:
1. each is woken (`tags`: a partial wake leaves it asleep, not verified, out of the fence --
   unless it woke the last allocation still asleep, as `weights` then `kv_cache` do: a
   member that reports itself fully awake after it goes on as after a full wake);
2. it is brought to the fleet's weights where it fell behind -- the fleet was updated while
   it slept, or it slept at level 2, which discards the weights (on an accelerator) -- from
   the desired state's disk source, as the reconciler would;
3. verified: it reports the desired version (or the one it slept with, when none is
   desired), its engine is alive and awake, and where it slept with a checksum digest and
   is at that version again, its checksums give the same digest;
4. only then does it leave `desired.asleep` (back inside the fence), and it is resumed, or
   paused as the fleet or its hold wants.
A member that fails any step stays recorded asleep (out of the fence; the reconciler puts it
back to sleep), and its result says which step failed and why.

Refused before anything is touched: a malformed or unmatched selector (422), an unknown id
(404), both given (422), a member whose flavor has no sleep mode, or a partial wake (`tags`)
naming one whose flavor wakes everything at once (Dynamo): 409 `capability_missing`, naming it.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import UTC, datetime
from typing import Any

from rlcp.controlplane.errors import InvalidInput, MissingCapability, NotFound
from rlcp.controlplane.fleet.desired import load_source, wanted_pause
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.select import read_selector, selected
from rlcp.controlplane.operations.context import OperationContext, Run, require_capability
from rlcp.controlplane.operations.steps import StepDone
from rlcp.controlplane.operations.transaction import (
    Begin,
    Call,
    Effect,
    Open,
    PublishFence,
    Steps,
    Write,
    run_operation,
)
from rlcp.controlplane.operations.verify import check_woken, checksums_digest
from rlcp.controlplane.workers.capabilities import (
    CHECKSUMS,
    CONTROL,
    DISK_WEIGHTS,
    DRIVER,
    SLEEP,
    Control,
    Driver,
    has,
    implements,
)
from rlcp.controlplane.workers.steps import Step, status_answer
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.controller import OperationResult, Phase, SleepRecord, SleepRequest, WakeUpRequest

FULL_WAKE = frozenset({"weights", "kv_cache"})
KEPT_ASLEEP = "; kept asleep (out of the gateway's fence)"


def _named(records: list[WorkerRecord], selector_text: str | None, worker_ids: list[str] | None) -> list[WorkerRecord]:
    """The members a request names: by id (each must be a member), by selector (some must
    match), or all of them."""
    if selector_text is not None and worker_ids is not None:
        raise InvalidInput("give selector or worker_ids, not both", field="worker_ids")
    if worker_ids is not None:
        known = {r.id for r in records}
        if records and (unknown := sorted(set(worker_ids) - known)):
            raise NotFound(f"no member {', '.join(map(repr, unknown))}", field="worker_ids")
        return [r for r in records if r.id in set(worker_ids)]
    selector = read_selector(selector_text)
    chosen = selected(records, selector)
    if records and not chosen:
        raise InvalidInput(f"selector {selector_text!r} matches none of the {len(records)} members", field="selector")
    return chosen


def _detail(req: SleepRequest | WakeUpRequest) -> dict[str, Any]:
    return ({"selector": req.selector} if req.selector is not None else {}) | (
        {"worker_ids": req.worker_ids} if req.worker_ids is not None else {}
    )


def is_asleep(ctx: OperationContext, rec: WorkerRecord) -> bool:
    """Kept asleep by the controller, or reporting itself asleep (put to sleep by hand)."""
    return rec.id in ctx.desired.state.asleep or bool(rec.status is not None and rec.status.sleeping)


# -- sleep ------------------------------------------------------------------------------------
async def sleep(ctx: OperationContext, req: SleepRequest) -> OperationResult:
    return await run_operation(ctx, sleeping(ctx, req))


def sleeping(ctx: OperationContext, req: SleepRequest) -> Steps:
    """A sleep's steps: the members named (refused before the gate), open, begin, those already
    asleep skipped, the rest put to sleep."""

    def named(records: list[WorkerRecord]) -> list[WorkerRecord]:
        chosen = _named(records, req.selector, req.worker_ids)
        require_capability(chosen, "sleep", "sleep")
        return chosen

    named(ctx.registry.members())  # refused before the gate; and again once it is held (membership may move)
    detail: dict[str, Any] = {"level": req.level, "mode": req.mode} | _detail(req)
    run: Run = yield Open("sleep", detail, named)
    yield Begin()
    run.tracker.note(workers=[r.id for r in run.members])
    going = []
    for r in run.members:
        if r.id in ctx.desired.state.asleep:
            run.tracker.skip(r.id, "sleep", "already asleep")
        else:
            going.append(r)
    if going:
        yield from _put_to_sleep(run, going, req)


def _put_to_sleep(run: Run, records: list[WorkerRecord], req: SleepRequest) -> Generator[Effect, Any, None]:
    ctx = run.ctx
    ids = [r.id for r in records]
    ctx.registry.cordon(ids)  # no new rollout is sent to a member about to stop
    try:
        yield PublishFence()  # nor by a data plane holding its own copy of the fence
        hashing = [r for r in records if has(r.driver, "checksums")]
        hashing_step = Step(
            name="checksums",
            phase="sleeping",
            can=CHECKSUMS,
            call=lambda w: w.weight_checksums(),
            deadline_s=ctx.deadlines.checksums_s,
        )
        hashed: StepDone[dict[str, str] | None] = yield Call(hashing_step, hashing)
        failed = {r.id for r in hashing} - {r.id for r in hashed.ok}
        going = [r for r in records if r.id not in failed]
        now = datetime.now(UTC)
        asleep = ctx.desired.put_to_sleep(
            {
                r.id: SleepRecord(
                    level=req.level,
                    weight_version=r.status.weight_version if r.status is not None else None,
                    checksums_digest=checksums_digest(sums) if (sums := hashed.answers.get(r.id)) else None,
                    since=now,
                )
                for r in going
            }
        )
        yield Write(asleep)
    finally:
        # From here the desired state keeps them out; one that could not be hashed serves again.
        ctx.registry.cordon(ids, False)
    if not going:
        return
    deadline = ctx.deadlines.pause(req.timeout_s)
    slept: StepDone[None] = yield Call(
        Step(
            name="sleep",
            can=SLEEP,
            call=lambda w: w.sleep(req.level, req.mode, deadline),
            deadline_s=ctx.deadlines.call_over(deadline),
        ),
        going,
    )
    _note_kept_asleep(
        run,
        [r.id for r in going if r not in slept.ok],
        "; kept asleep in the desired state (out of the fence): the reconciler puts it to sleep when "
        "it answers, and POST /v1/rl/wake_up brings it back",
    )


# -- wake_up ----------------------------------------------------------------------------------
async def wake_up(ctx: OperationContext, req: WakeUpRequest) -> OperationResult:
    return await run_operation(ctx, waking_up(ctx, req))


def waking_up(ctx: OperationContext, req: WakeUpRequest) -> Steps:
    """A wake's steps: the sleepers named (refused before the gate), open, begin, the wake, a
    partial wake's status read, the reload of those behind, the verification, the return."""
    named = _named(ctx.registry.members(), req.selector, req.worker_ids)
    partial = req.tags is not None and set(req.tags) != FULL_WAKE
    _require_wake([r for r in named if is_asleep(ctx, r)], partial)

    def about(records: list[WorkerRecord]) -> list[WorkerRecord]:
        """The sleepers; a member named by id that is awake too, to be said so."""
        named = _named(records, req.selector, req.worker_ids)
        sleepers = [r for r in named if is_asleep(ctx, r)]
        _require_wake(sleepers, partial)
        return sleepers if req.worker_ids is None else named

    waking = Step(
        name="wake_up",
        can=SLEEP,
        call=lambda w: w.wake_up(list(req.tags) if partial and req.tags else None),
        deadline_s=ctx.deadlines.call_over(ctx.deadlines.weight_load_s),
    )

    run: Run = yield Open("wake_up", {"tags": req.tags} | _detail(req), about)
    yield Begin()
    sleepers = [r for r in run.members if is_asleep(ctx, r)]
    run.tracker.note(workers=[r.id for r in sleepers])
    for r in run.members:
        if r not in sleepers:
            run.tracker.skip(r.id, "wake_up", "not asleep")
    if not sleepers:
        return
    woken: StepDone[None] = yield Call(waking, sleepers)
    woke = woken.ok
    _note_kept_asleep(run, [r.id for r in sleepers if r not in woke], KEPT_ASLEEP)
    if partial:
        woke = yield from _fully_awake(run, woke)
        if not woke:
            return
    verified = yield from _verify_woken(run, woke)
    yield from _return_to_service(run, verified)


def _fully_awake(run: Run, records: list[WorkerRecord]) -> Generator[Effect, Any, list[WorkerRecord]]:
    """After a partial wake, the members it left fully awake: vLLM's wakes add up (`weights`,
    then `kv_cache`, as a colocated trainer wakes), so the one that wakes the last allocation
    is a full wake, verified and returned like any. The others stay asleep, not verified."""
    read: StepDone[WorkerStatus] = yield Call(_status_step(run, "waking"), records)
    awake = [r for r in read.ok if (status := read.answers.get(r.id)) is not None and status.sleeping is False]
    if len(awake) < len(records):
        run.tracker.note(partial=True)  # some still asleep: neither verified nor returned
    return awake


def _require_wake(sleepers: list[WorkerRecord], partial: bool) -> None:
    """Refuse, before any worker is touched, a wake some sleeper cannot do: any wake without
    the sleep capability, a partial one (tags) where its flavor wakes everything at once."""
    require_capability(sleepers, "sleep", "wake_up")
    whole = [r for r in sleepers if implements(r.driver, SLEEP) and not r.driver.partial_wake] if partial else []
    if whole:
        names = ", ".join(f"{r.id} ({r.spec.flavor})" for r in whole)
        raise MissingCapability(
            f"a partial wake (tags) needs a flavor that can finish it later; these members "
            f"wake everything at once: {names}",
            workers={r.id: "partial_wake" for r in whole},
        )


def _verify_woken(run: Run, records: list[WorkerRecord]) -> Generator[Effect, Any, list[WorkerRecord]]:
    """The woken members that are at the fleet's weights (loaded again where they fell
    behind) and verified; the others' results say why."""
    ctx = run.ctx
    desired = ctx.desired.state
    slept = {r.id: desired.asleep.get(r.id) for r in records}
    read: StepDone[WorkerStatus] = yield Call(_status_step(run, "verifying", observe=True), records)
    checked, reloaded = yield from _reload_behind(run, read, slept)

    async def check(driver: Driver) -> None:
        worker_id = driver.spec.id
        status = await driver.status() if worker_id in reloaded else read.answers[worker_id]  # a reload moved it
        await check_woken(driver, status, slept[worker_id], desired.weight_version)

    checking: StepDone[None] = yield Call(
        Step(name="verify", can=DRIVER, call=check, deadline_s=ctx.deadlines.checksums_s), checked
    )
    verified = checking.ok
    failed = [r.id for r in records if r not in verified]
    for worker_id in failed:
        result = run.tracker.results.get(worker_id)
        if result is not None and result.phase == "verify" and result.status == "error":
            run.tracker.set_result(result.model_copy(update={"code": "verify_failed"}))
    _note_kept_asleep(run, [r.id for r in checked if r not in verified], KEPT_ASLEEP)
    return verified


def _reload_behind(
    run: Run, read: StepDone[WorkerStatus], slept: dict[str, SleepRecord | None]
) -> Generator[Effect, Any, tuple[list[WorkerRecord], set[str]]]:
    """Load the fleet's checkpoint again into the woken members that fell behind it (level 2
    lost their weights); answers the members to verify and the ids of those reloaded."""
    desired = run.ctx.desired.state
    source = load_source(desired)
    if source is not None and desired.weight_version is not None and source["version"] != desired.weight_version:
        source = None  # an older disk copy (the desired version came by broadcast): loading it cannot help

    def behind(rec: WorkerRecord) -> bool:
        status, record = read.answers.get(rec.id), slept[rec.id]
        if source is None or not has(rec.driver, "disk_weights"):
            return False
        if record is not None and record.level == 2:
            return True  # level 2 discards the weights: reload them, whatever the version says
        return status is not None and status.weight_version != source["version"]

    reloading = [r for r in read.ok if behind(r)]
    if not reloading or source is None:
        return read.ok, set()
    path, version = source["path"], source["version"]
    reload = Step(
        name="update",
        can=DISK_WEIGHTS,
        call=lambda w: w.update_weights_from_disk(path, version),
        deadline_s=run.ctx.deadlines.load_step(None, checksums=False),
    )
    reloaded: StepDone[None] = yield Call(reload, reloading)
    loaded = reloaded.ok
    _note_kept_asleep(run, [r.id for r in reloading if r not in loaded], KEPT_ASLEEP)
    return [r for r in read.ok if r not in reloading or r in loaded], {r.id for r in reloading}


def _return_to_service(run: Run, records: list[WorkerRecord]) -> Generator[Effect, Any, None]:
    """Verified: out of `desired.asleep` (back inside the fence), then running -- or paused,
    if the fleet is paused or a hold names it."""
    if not records:
        return
    ctx = run.ctx
    yield Write(ctx.desired.wake([r.id for r in records]))
    desired = ctx.desired.state
    for mode in (None, "abort", "wait", "keep"):
        group = [r for r in records if wanted_pause(desired, r.id) == mode]
        if group:
            yield Call(_back(run, mode), group)


def _back(run: Run, mode: PauseMode | None) -> Step[Control, None]:
    """Back to what the fleet wants of it: resumed, or paused in `mode`."""
    d = run.ctx.deadlines
    if mode is None:
        return Step(name="resume", can=CONTROL, call=lambda w: w.resume(), deadline_s=d.control_s)
    pause_s = d.pause()
    return Step(name="pause", can=CONTROL, call=lambda w: w.pause(mode, pause_s), deadline_s=d.call_over(pause_s))


def _status_step(run: Run, phase: Phase, *, observe: bool = False) -> Step[Driver, WorkerStatus]:
    """A status read, in `phase`; `observe`: recorded as fresh reads."""
    return Step(
        name="status",
        phase=phase,
        can=DRIVER,
        call=lambda w: w.status(),
        deadline_s=run.ctx.deadlines.control_s,
        observe=status_answer if observe else None,
    )


def _note_kept_asleep(run: Run, worker_ids: list[str], note: str) -> None:
    for worker_id in worker_ids:
        result = run.tracker.results.get(worker_id)
        if result is not None and result.status != "ok" and note not in (result.message or ""):
            run.tracker.set_result(result.model_copy(update={"message": (result.message or "") + note}))

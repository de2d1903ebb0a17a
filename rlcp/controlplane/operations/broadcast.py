"""Broadcast weight updates: the fleet as the inference side of one weight-transfer group.

vLLM's protocol (`vllm/distributed/weight_transfer/`) has four calls: init (join the
trainer's group), start, one or more update chunks (each receives a broadcast), and
finish (naming the version). The trainer is rank 0; the controller gives each worker
its `rank_offset` from the members' world sizes, in worker-id order, and fans every
call out at once: init and each chunk block on every worker until the trainer's
broadcast arrives, so they must run side by side.

Rules that keep a fleet from deadlocking or serving half-updated weights:
- The trainer's `world_size` must be 1 + the fleet's inference ranks: checked before
  any worker is touched (422 naming the field).
- The group remembers the membership epoch and each worker's instance id and spec at init. A
  change (a member added, removed, or restarted) makes start fail fast with 409
  `membership_changed`, whose body names who joined, left and restarted (the state's group shows
  the same while stale); the trainer re-initialises the group, and that init's detail keeps the
  change it replaced (`replaces_stale_group`), so the operations log says why a group was formed
  again. Inside an open round only a group member that left or restarted refuses the next call
  (it breaks the collective); a worker that joined is not in the group and waits for the next
  round's start.
- Start pauses a fleet the trainer has not paused (finish resumes it, so a trainer that
  never pauses, as TRL's `GRPOTrainer`, never has to resume), and opens a session: until
  finish, other operations get 409 and the reconciler stays away.
- A finish that names no version gets one minted by the controller (`broadcast-<n>`,
  `fleet/desired.py: minted_version`), sent to every worker with the finish, so the
  applied version is never null after a successful update.
- Any failure, or a trainer that goes quiet past `idle_timeout_s`, aborts the update:
  the surviving workers finish without a version (their engines leave the half-done
  reload intact and usable), those that received nothing resume, those that received
  chunks stay paused and not ready until the reconciler loads a disk copy or the next
  broadcast lands. The call returns at once with every worker's result; state names
  the worker and the phase. The group is dropped: init again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import structlog

from rlcp.controlplane.errors import Conflict, InconsistentInput, InvalidInput, NoMembers, StaleTransferGroup
from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.fleet.desired import minted_version
from rlcp.controlplane.fleet.members import FleetRegistry, WorkerRecord
from rlcp.controlplane.fleet.paths import check_path
from rlcp.controlplane.metrics import FailedStep
from rlcp.controlplane.operations.context import NOT_BEGUN, OperationContext, Run, require_capability
from rlcp.controlplane.operations.steps import StepDone, StepIncomplete
from rlcp.controlplane.operations.transaction import Begin, Call, Effect, Open, Steps, Write, perform, run_operation
from rlcp.controlplane.operations.verify import verify
from rlcp.controlplane.settings.weight_transfer import WeightTransferSettings
from rlcp.controlplane.workers.capabilities import (
    BROADCAST,
    CONTROL,
    DESIRED_VERSION,
    BroadcastPeer,
    Control,
    has,
    refuse_transfer_input,
    require_one_transfer_wire,
)
from rlcp.controlplane.workers.steps import Step
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.wire.controller import (
    Checkpoint,
    MembershipDelta,
    OperationKind,
    OperationResult,
    TransferFinishRequest,
    TransferGroupView,
    TransferInitRequest,
    TransferMember,
    TransferUpdateRequest,
)

log = structlog.get_logger("rlcp.controlplane.operations.broadcast")
SESSION: OperationKind = "weight_transfer_update"
# Why an update ends when one of its collective steps (declared `abort`) fails on some worker.
_ABORTED_BY: dict[FailedStep, str] = {
    "pause": "a worker did not pause",
    "start_weight_update": "a worker did not start the update",
    "update_weights": "a worker failed an update chunk",
    "finish_weight_update": "a worker failed to finish the update",
}


@dataclass(frozen=True)
class _Member:
    worker_id: str
    rank_offset: int
    world_size: int
    instance_id: str | None
    spec: WorkerSpec  # as discovered at init: a changed one is a member started afresh


@dataclass
class _Group:
    epoch: int
    world_size: int
    members: list[_Member]


@dataclass
class _Update:
    """An open update: from start to finish (or abort)."""

    run: Run
    records: list[WorkerRecord]
    paused_by_us: bool
    chunks: int = 0
    last_call: float = field(default_factory=time.monotonic)
    watchdog: asyncio.Task[None] | None = None


def plan_ranks(sizes: dict[str, int]) -> list[tuple[str, int, int]]:
    """(worker id, rank_offset, world size) in id order; the trainer is rank 0."""
    out, offset = [], 1
    for worker_id in sorted(sizes):
        out.append((worker_id, offset, sizes[worker_id]))
        offset += sizes[worker_id]
    return out


class WeightTransfer:
    """The fleet's side of one trainer's weight-transfer group, and its open update."""

    def __init__(
        self,
        ctx: OperationContext,
        *,
        settings: WeightTransferSettings,
        changes: ChangeCounter,
        is_leader: Callable[[], bool],
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self._changes = changes
        self._is_leader = is_leader
        self._group: _Group | None = None
        self._update: _Update | None = None

    @property
    def group(self) -> _Group | None:
        return self._group

    @group.setter
    def group(self, group: _Group | None) -> None:
        self._group = group
        self._changes.bump()

    @property
    def update(self) -> _Update | None:
        return self._update

    @update.setter
    def update(self, update: _Update | None) -> None:
        self._update = update
        self._changes.bump()

    # -- reads ---------------------------------------------------------------------------
    def world_size(self) -> int:
        """Inference ranks across the fleet (what vLLM's `/get_world_size` answers)."""
        return sum(r.world_size for r in group_candidates(self.ctx.registry))

    def view(self) -> TransferGroupView | None:
        g = self.group
        if g is None:
            return None
        change = self._change(g)
        return TransferGroupView(
            membership_epoch=g.epoch,
            stale=change is not None,
            change=change,
            world_size=g.world_size,
            members=[
                TransferMember(worker_id=m.worker_id, rank_offset=m.rank_offset, world_size=m.world_size)
                for m in g.members
            ],
            updating=self.update is not None,
            chunks=self.update.chunks if self.update else 0,
        )

    # -- init ------------------------------------------------------------------------------
    async def init(self, req: TransferInitRequest) -> OperationResult:
        return await run_operation(self.ctx, self._forming(req))

    def _forming(self, req: TransferInitRequest) -> Steps:
        """An init's steps: every refusal before the gate (`_plan`), open, begin, the old group
        dropped, every member joins -- all or none: when one fails, those that joined leave
        again -- and the new group kept."""
        ctx = self.ctx
        offsets, expected = self._plan(req)
        deadline = ctx.deadlines.transfer_init_s
        joining = Step(
            name="init_weight_transfer",
            can=BROADCAST,
            call=lambda w: w.init_weight_transfer(req.init_info | {"rank_offset": offsets[w.spec.id]}, deadline),
            deadline_s=ctx.deadlines.call_over(deadline),
            on_failure="abort",
        )
        detail: dict[str, Any] = {"world_size": expected, "ranks": offsets}
        if self.group is not None and (replaced := self._change(self.group)) is not None:
            detail["replaces_stale_group"] = replaced.model_dump(mode="json")
        # The group's members are the ones the ranks were planned for (`group_candidates`).
        run: Run = yield Open("weight_transfer_init", detail, lambda records: [r for r in records if r.id in offsets])
        yield Begin()
        self.group = None  # a new init replaces the old group, joined or not
        try:
            yield Call(joining, run.members)
        except StepIncomplete as exc:
            # The collective cannot form without every rank: release the ones that joined.
            yield Call(self._leaving(), exc.done.ok)
            return
        self.group = _Group(
            epoch=run.tracker.epoch,
            world_size=expected,
            members=[
                _Member(r.id, offsets[r.id], r.world_size, r.status.instance_id if r.status else None, r.spec)
                for r in run.members
            ],
        )
        log.info("weight_transfer_group_formed", world_size=expected, epoch=run.tracker.epoch)

    def _plan(self, req: TransferInitRequest) -> tuple[dict[str, int], int]:
        """Each member's rank offset and the group's world size, or the refusal, before any
        worker is touched."""
        ctx = self.ctx
        every = ctx.registry.members()
        if not every:
            raise NoMembers("the fleet has no members")
        # What the fleet's members are, answering or not, decides whether it can broadcast at all.
        require_capability(every, "broadcast", "a broadcast weight transfer")
        require_one_transfer_wire(r.driver for r in every)
        refuse_transfer_input((r.driver for r in every), init_info=req.init_info)
        if asleep := sorted(ctx.desired.state.asleep):
            # The group spans every member's ranks, and an engine asleep cannot take weights.
            raise Conflict(
                f"members asleep cannot join a weight-transfer group: {', '.join(asleep)}; wake them "
                "(POST /v1/rl/wake_up) first"
            )
        if not (members := group_candidates(ctx.registry)):
            raise NoMembers("every member of the fleet failed its last status read: none can join a group")
        ranks = plan_ranks({r.id: r.world_size for r in members})
        expected = 1 + sum(size for _, _, size in ranks)
        got = req.init_info.get("world_size")
        if not isinstance(got, int) or isinstance(got, bool) or got != expected:
            raise InconsistentInput(
                f"init_info.world_size must be {expected}: the trainer (rank 0) plus the fleet's "
                f"{expected - 1} inference ranks; got {got!r}",
                field="init_info.world_size",
            )
        return {worker_id: offset for worker_id, offset, _ in ranks}, expected

    async def shutdown(self) -> OperationResult:
        if self.update is not None:
            async with self.ctx.gate.api_operation(SESSION, in_session=True):
                if self.update is not None:
                    with self.update.run.bound():
                        await self._abort("the trainer shut the weight transfer down during an update")
        self.group = None
        return await run_operation(self.ctx, self._leaving_group())

    def _leaving_group(self) -> Steps:
        run: Run = yield Open("weight_transfer_shutdown", {})
        yield Begin()
        # Only members that can be in a group have one to leave.
        yield Call(self._leaving(), [r for r in run.members if has(r.driver, "broadcast")])

    def _leaving(self) -> Step[BroadcastPeer, None]:
        return Step(
            name="shutdown_weight_transfer",
            can=BROADCAST,
            call=lambda w: w.shutdown_weight_transfer(),
            deadline_s=self.ctx.deadlines.control_s,
        )

    # -- the update session ------------------------------------------------------------------
    async def start(self) -> OperationResult:
        ctx = self.ctx
        async with ctx.gate.api_operation(SESSION):
            group = self._require_group()
            run = Run(ctx, SESSION, {"world_size": group.world_size})
            try:
                await run.begin()
            except BaseException:
                run.close(interrupted=NOT_BEGUN)
                raise
            records = [r for r in (ctx.registry.get(m.worker_id) for m in group.members) if r is not None]
            update = self.update = _Update(run=run, records=records, paused_by_us=not ctx.desired.state.paused)
            ctx.gate.begin_session(SESSION)
            with run.bound():
                try:
                    await perform(run, self._starting(update))
                except StepIncomplete as exc:
                    return await self._abort(_ABORTED_BY[exc.step.name])
                update.watchdog = asyncio.create_task(self._watch_idle(update), name="weight-transfer-idle")
                return run.tracker.snapshot()

    def _starting(self, update: _Update) -> Generator[Effect, Any, None]:
        """A session's first steps: the members paused (unless the fleet already is), then
        started; each must take it, or the session aborts."""
        d = self.ctx.deadlines
        pause_s = d.pause()
        if update.paused_by_us:
            yield Call(
                Step(
                    name="pause",
                    can=CONTROL,
                    call=lambda w: w.pause(self.settings.pause_mode, pause_s),
                    deadline_s=d.call_over(pause_s),
                    on_failure="abort",
                ),
                update.records,
            )
        starting = Step(
            name="start_weight_update",
            can=BROADCAST,
            call=lambda w: w.start_weight_update(),
            deadline_s=d.transfer_chunk_s,
            on_failure="abort",
        )
        yield Call(starting, update.records)

    async def update_chunk(self, req: TransferUpdateRequest) -> OperationResult:
        return await self._in_session("update_weights", lambda u: self._chunk(u, req))

    async def _chunk(self, update: _Update, req: TransferUpdateRequest) -> OperationResult:
        # A chunk some member cannot take: a 422 with nothing sent (the update stays open).
        refuse_transfer_input((r.driver for r in update.records), update_info=req.update_info)
        update.chunks += 1
        self._changes.bump()
        deadline = self.ctx.deadlines.transfer_chunk_s
        # The chunk's number is in its results (`update_weights[3]`), not in the step's name.
        chunk = Step(
            name="update_weights",
            label=f"update_weights[{update.chunks}]",
            can=BROADCAST,
            call=lambda w: w.update_weights(req.update_info, deadline),
            deadline_s=self.ctx.deadlines.call_over(deadline),
            on_failure="abort",
        )
        try:
            await perform(update.run, _each(chunk, update.records))
        except StepIncomplete as exc:
            return await self._abort(_ABORTED_BY[exc.step.name])
        return update.run.tracker.snapshot()

    async def finish(self, req: TransferFinishRequest) -> OperationResult:
        checkpoint = None
        if req.checkpoint_path is not None:
            if req.weight_version is None:
                raise InvalidInput(
                    "checkpoint_path needs weight_version: a disk copy must name its version", field="checkpoint_path"
                )
            checkpoint = Checkpoint(
                path=check_path(req.checkpoint_path, "checkpoint_path", self.ctx.allowed_roots),
                version=req.weight_version,
            )
        return await self._in_session("finish_weight_update", lambda u: self._finish(u, req, checkpoint))

    async def _finish(
        self, update: _Update, req: TransferFinishRequest, checkpoint: Checkpoint | None
    ) -> OperationResult:
        ctx, run = self.ctx, update.run
        # A finish that names no version (TRL's names none) gets one: the fleet's applied version,
        # the fence and every answer's version header then say which weights serve.
        minted: int | None = None
        if req.weight_version is not None:
            version = req.weight_version
        else:
            version, minted = minted_version(ctx.desired.state)
        run.tracker.note(version=version, chunks=update.chunks, version_minted=minted is not None)
        try:
            await perform(run, self._finishing(update, version, checkpoint, minted))
        except StepIncomplete as exc:
            return await self._abort(_ABORTED_BY[exc.step.name], finished=exc.done.ok)
        return await self._close(update)

    def _finishing(
        self, update: _Update, version: str, checkpoint: Checkpoint | None, minted: int | None
    ) -> Generator[Effect, Any, None]:
        """A session's last steps: every member finishes (or the session aborts), the new
        weights become the desired state, those that gate readiness on it are told, verified,
        and resumed where the session paused them."""
        ctx, run = self.ctx, update.run
        finishing = Step(
            name="finish_weight_update",
            can=BROADCAST,
            call=lambda w: w.finish_weight_update(version),
            deadline_s=ctx.deadlines.transfer_chunk_s,
            on_failure="abort",
        )
        yield Call(finishing, update.records)
        # Every worker holds the new weights: they are the desired state now (the trainer may
        # rename them with update_weight_version).
        yield Write(ctx.desired.set_broadcast_weights(version, checkpoint, minted=minted))
        yield from tell_desired(run, [r for r in update.records if r.tracks_desired], version)
        verified = update.records
        if self.settings.verify:
            verified = yield from verify(run, update.records, version)
        ctx.log.set_verified(self.settings.verify and len(verified) == len(ctx.registry.members()))
        if update.paused_by_us and not ctx.desired.state.paused:
            held = ctx.desired.state.held  # members an operator holds paused stay paused
            yield Call(_resuming(ctx), [r for r in verified if r.id not in held])

    async def update_weight_version(self, version: str) -> OperationResult:
        """Name the weights every member holds (vLLM's `/update_weight_version`)."""
        ctx = self.ctx
        return await run_operation(ctx, self._renaming(version))

    def _renaming(self, version: str) -> Steps:
        ctx = self.ctx
        require_capability(ctx.registry.members(), "broadcast", "naming broadcast weights")
        naming = Step(
            name="update_weight_version",
            can=BROADCAST,
            call=lambda w: w.update_weight_version(version),
            deadline_s=ctx.deadlines.control_s,
        )
        run: Run = yield Open("weight_transfer_update", {"version": version, "rename_only": True})
        yield Begin()
        yield Write(ctx.desired.rename_weights(version))
        yield Call(naming, run.members)

    def forget(self, reason: str) -> None:
        """Drop the group and any open update without touching a worker: in a new leadership
        term another replica may have driven the workers since, so neither is ours to go
        on with. The trainer's next call gets 409 and it initialises again."""
        if self.group is None and self.update is None:
            return
        log.warning("weight_transfer_forgotten", reason=reason)
        update, self.update, self.group = self.update, None, None
        if update is not None:
            self.ctx.gate.end_session()
            if update.watchdog is not None:
                update.watchdog.cancel()
            update.run.tracker.note(aborted=reason)
            update.run.close(interrupted=reason)

    # -- internals ----------------------------------------------------------------------------
    async def _in_session(self, phase: str, call: Callable[[_Update], Awaitable[OperationResult]]) -> OperationResult:
        ctx = self.ctx
        if self.update is None:
            raise Conflict(f"{phase}: no weight update is open; call start_weight_update first")
        async with ctx.gate.api_operation(SESSION, in_session=True):
            update = self.update
            if update is None:  # aborted by the idle watchdog while this call waited
                raise Conflict(f"{phase}: the weight update was aborted; start again")
            update.last_call = time.monotonic()
            with update.run.bound():
                assert self.group is not None
                # Only a member of the group that left or restarted breaks the collective. A worker
                # that joined since the group formed is not in it: the round completes with the
                # group, the reconciler converges the joiner from the version's disk copy, and the
                # next round's start refuses the stale group (409), so the trainer re-forms once,
                # between rounds, and loses nothing.
                change = self._change(self.group, answering=False)  # a status read missed mid-round breaks nothing
                if change is not None and (change.left or change.restarted):
                    await self._abort(f"membership changed during the update: {change.describe()}")
                    raise _membership_changed(change)
                try:
                    return await call(update)
                finally:
                    update.last_call = time.monotonic()

    def _require_group(self) -> _Group:
        if self.group is None:
            raise Conflict("no weight-transfer group: call init_weight_transfer_engine first")
        if (change := self._change(self.group)) is not None:
            raise _membership_changed(change)
        return self.group

    def _change(self, group: _Group, *, answering: bool = True) -> MembershipDelta | None:
        """How the fleet differs from the group's members, or None when it still matches.
        `answering`: the fleet as the members that answer (`group_candidates`), else every member."""
        registry = self.ctx.registry
        ids = {m.worker_id for m in group.members}
        present = {r.id for r in group_candidates(registry)} if answering else registry.ids()
        restarted = []
        for m in group.members:
            rec = registry.get(m.worker_id)
            if rec is None:
                continue
            status = rec.status
            # A status not read yet (None) proves nothing; a changed spec is a new member record.
            new_instance = status is not None and m.instance_id is not None and status.instance_id != m.instance_id
            if new_instance or rec.spec != m.spec:
                restarted.append(m.worker_id)
        delta = MembershipDelta(
            joined=sorted(present - ids),
            left=sorted(ids - present),
            restarted=restarted,
            group_epoch=group.epoch,
            membership_epoch=registry.membership.epoch,
        )
        # The epoch alone proves nothing: a member the group already left out (it stopped answering)
        # and then unlisted moves it with no one joining, leaving or restarting, and a group re-formed
        # for that would count one change twice.
        if delta.joined or delta.left or delta.restarted:
            return delta
        return None

    async def _abort(self, reason: str, *, finished: list[WorkerRecord] | None = None) -> OperationResult:
        """End the open update after a failure; see the module docstring for what each worker gets."""
        update = self.update
        assert update is not None
        run = update.run
        log.warning("weight_transfer_aborted", reason=reason, chunks=update.chunks)
        run.tracker.note(aborted=reason, chunks=update.chunks)
        self.group = None  # a collective that failed part-way cannot be trusted: init again
        done = {r.id for r in finished or []}
        alive = [r for r in update.records if r.id not in done and run.tracker.ok_so_far(r.id)]
        await perform(run, self._aborting(update, alive))
        return await self._close(update)

    def _aborting(self, update: _Update, alive: list[WorkerRecord]) -> Generator[Effect, Any, None]:
        """An aborted session's steps: those still sound finish without a version (restoring the
        engine's layers: a reload left open would kill the next forward pass), and, where the
        session paused them and nothing was sent yet, resume."""
        ctx, run = self.ctx, update.run
        restoring = Step(
            name="finish_weight_update",
            label="abort:finish_weight_update",
            can=BROADCAST,
            call=lambda w: w.finish_weight_update(None),
            deadline_s=ctx.deadlines.transfer_chunk_s,
            on_failure="amend",
        )
        yield Call(restoring, alive)
        if update.paused_by_us and not ctx.desired.state.paused and update.chunks == 0:
            intact = [r for r in update.records if run.tracker.ok_so_far(r.id) and r.id not in ctx.desired.state.held]
            yield Call(_resuming(ctx), intact)

    async def _close(self, update: _Update) -> OperationResult:
        self.update = None
        self.ctx.gate.end_session()
        if update.watchdog is not None and update.watchdog is not asyncio.current_task():
            update.watchdog.cancel()
        result = await update.run.end()
        await self.ctx.refresh(update.run.answering(update.records))
        return result

    async def _watch_idle(self, update: _Update) -> None:
        """Abort an update the trainer stopped driving, so the fleet is not left paused."""
        idle_s = self.settings.idle_timeout_s
        while self.update is update:
            if not self._is_leader():
                return  # a follower touches no worker; a later term of ours forgets the update
            wait = update.last_call + idle_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            with contextlib.suppress(Conflict):
                async with self.ctx.gate.api_operation(SESSION, in_session=True):
                    if self.update is update and time.monotonic() - update.last_call >= idle_s:
                        with update.run.bound():
                            await self._abort(f"no call from the trainer for {idle_s:g}s")
                        return
            await asyncio.sleep(min(1.0, idle_s))  # a call is in flight: look again after it


def group_candidates(registry: FleetRegistry) -> list[WorkerRecord]:
    """The members a group is formed with: all but those whose last status read failed (one not
    read yet is given the benefit of the doubt). A member listed but not answering (an engine
    still starting, a Ray actor restarting, a dead worker a static list still names) would fail
    the init, and every push with it; left out, it is converged from the version's disk copy
    once it answers (as a joiner is), and the next round's start counts it as joined, so the
    group is formed again with it once."""
    return [r for r in registry.members() if r.reachable or (r.last_seen is None and r.last_error is None)]


def _membership_changed(change: MembershipDelta) -> StaleTransferGroup:
    log.warning("weight_transfer_group_stale", **change.model_dump())
    return StaleTransferGroup(f"{change.describe()}; initialise the weight transfer again", change=change)


def _resuming(ctx: OperationContext) -> Step[Control, None]:
    return Step(name="resume", can=CONTROL, call=lambda w: w.resume(), deadline_s=ctx.deadlines.control_s)


def _each(step: Step[Any, Any], records: list[WorkerRecord]) -> Generator[Effect, Any, None]:
    yield Call(step, records)


def tell_desired(run: Run, records: list[WorkerRecord], version: str | None) -> Generator[Effect, Any, None]:
    """Tell workers that gate their readiness on it the desired version."""
    telling = Step(
        name="set_desired",
        can=DESIRED_VERSION,
        call=lambda w: w.set_desired_version(version),
        deadline_s=run.ctx.deadlines.control_s,
    )
    told: StepDone[None] = yield Call(telling, records)
    for r in told.ok:
        run.ctx.registry.told(r.id, version)

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
- The group remembers the membership epoch and each worker's instance id at init. A
  change (a member added, removed, or restarted) makes start and update fail fast with
  409 `membership_changed`; the trainer re-initialises the group.
- Start pauses a fleet the trainer has not paused (finish resumes it), and opens a
  session: until finish, other operations get 409 and the reconciler stays away.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from agents.errors import ConflictError, ValidationFailedError
from controlplane.adminapi.base import AdminAPI
from controlplane.errors import MembershipChangedError, NoMembersError
from controlplane.state import (BroadcastSource, Checkpoint, OperationResult, TransferFinishRequest,
                                TransferGroupView, TransferInitRequest, TransferMember, TransferUpdateRequest)
from controlplane.transaction import _Run, _run_operation, _verify

if TYPE_CHECKING:
    from controlplane.controller import Controller, WorkerRecord

log = structlog.get_logger("controlplane.broadcast")
SESSION = "weight_transfer_update"


@dataclass(frozen=True)
class _Member:
    worker_id: str
    rank_offset: int
    world_size: int
    instance_id: str | None


@dataclass
class _Group:
    epoch: int
    world_size: int
    members: list[_Member]


@dataclass
class _Update:
    """An open update: from start to finish (or abort)."""

    run: _Run
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
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.group: _Group | None = None
        self.update: _Update | None = None

    # -- reads ---------------------------------------------------------------------------
    def world_size(self) -> int:
        """Inference ranks across the fleet (what vLLM's `/get_world_size` answers)."""
        return sum(self._world_size(r) for r in self.ctl.members())

    def view(self) -> TransferGroupView | None:
        g = self.group
        if g is None:
            return None
        return TransferGroupView(
            membership_epoch=g.epoch, stale=self._change(g) is not None, world_size=g.world_size,
            members=[TransferMember(worker_id=m.worker_id, rank_offset=m.rank_offset, world_size=m.world_size)
                     for m in g.members],
            updating=self.update is not None, chunks=self.update.chunks if self.update else 0)

    # -- init ------------------------------------------------------------------------------
    async def init(self, req: TransferInitRequest) -> OperationResult:
        ctl = self.ctl
        members = ctl.members()
        if not members:
            raise NoMembersError("the fleet has no members")
        ranks = plan_ranks({r.spec.id: self._world_size(r) for r in members})
        expected = 1 + sum(size for _, _, size in ranks)
        got = req.init_info.get("world_size")
        if not isinstance(got, int) or isinstance(got, bool) or got != expected:
            raise ValidationFailedError(
                f"init_info.world_size must be {expected}: the trainer (rank 0) plus the fleet's "
                f"{expected - 1} inference ranks; got {got!r}", field="init_info.world_size")
        offsets = {worker_id: offset for worker_id, offset, _ in ranks}
        deadline = ctl.settings.weight_transfer.init_timeout_s

        async def body(run: _Run) -> None:
            self.group = None  # a new init replaces the old group, joined or not
            joined = await run.step(None, "init_weight_transfer", run.members,
                                    lambda a: a.init_weight_transfer(req.init_info | {
                                        "rank_offset": offsets[a.spec.id]}, deadline), deadline + 5)
            if len(joined) == len(run.members):
                self.group = _Group(epoch=run.tracker.epoch, world_size=expected, members=[
                    _Member(r.spec.id, offsets[r.spec.id], self._world_size(r),
                            r.status.instance_id if r.status else None) for r in run.members])
                log.info("weight_transfer_group_formed", world_size=expected, epoch=run.tracker.epoch)
            else:
                # The collective cannot form without every rank: release the ones that joined.
                await run.step(None, "shutdown_weight_transfer", joined, lambda a: a.shutdown_weight_transfer(),
                               ctl.settings.workers.timeout_s * 2)

        detail = {"world_size": expected, "ranks": {worker_id: offset for worker_id, offset, _ in ranks}}
        return await _run_operation(ctl, "weight_transfer_init", detail, body)

    async def shutdown(self) -> OperationResult:
        if self.update is not None:
            async with self.ctl.gate.api_operation(SESSION, in_session=True):
                if self.update is not None:
                    with self._bound(self.update.run):
                        await self._abort("the trainer shut the weight transfer down during an update")
        self.group = None
        return await _run_operation(self.ctl, "weight_transfer_shutdown", {}, lambda run: self._leave(run))

    async def _leave(self, run: _Run) -> None:
        await run.step(None, "shutdown_weight_transfer", run.members, lambda a: a.shutdown_weight_transfer(),
                       self.ctl.settings.workers.timeout_s * 2)

    # -- the update session ------------------------------------------------------------------
    async def start(self) -> OperationResult:
        ctl, s = self.ctl, self.ctl.settings.weight_transfer
        async with ctl.gate.api_operation(SESSION):
            group = self._require_group()
            run = _Run(ctl, SESSION, {"world_size": group.world_size})
            ctl.current = run.tracker
            records = [ctl.records[m.worker_id] for m in group.members]
            update = self.update = _Update(run=run, records=records, paused_by_us=not ctl.desired.paused)
            ctl.gate.begin_session(SESSION)
            with self._bound(run):
                if update.paused_by_us:
                    pause_s = ctl.settings.workers.pause_timeout_s
                    paused = await run.step("pausing", "pause", records, lambda a: a.pause(s.pause_mode, pause_s),
                                            pause_s + 5)
                    if len(paused) < len(records):
                        return await self._abort("a worker did not pause")
                started = await run.step("updating", "start_weight_update", records,
                                         lambda a: a.start_weight_update(), s.chunk_timeout_s)
                if len(started) < len(records):
                    return await self._abort("a worker did not start the update")
                update.watchdog = asyncio.create_task(self._watch_idle(update), name="weight-transfer-idle")
                return run.tracker.snapshot()

    async def update_chunk(self, req: TransferUpdateRequest) -> OperationResult:
        return await self._in_session("update_weights", lambda u: self._chunk(u, req))

    async def _chunk(self, update: _Update, req: TransferUpdateRequest) -> OperationResult:
        update.chunks += 1
        deadline = self.ctl.settings.weight_transfer.chunk_timeout_s
        done = await update.run.step("updating", f"update_weights[{update.chunks}]", update.records,
                                     lambda a: a.update_weights(req.update_info, deadline), deadline + 5)
        if len(done) < len(update.records):
            return await self._abort("a worker failed an update chunk")
        return update.run.tracker.snapshot()

    async def finish(self, req: TransferFinishRequest) -> OperationResult:
        checkpoint = None
        if req.checkpoint_path is not None:
            if req.weight_version is None:
                raise ValidationFailedError("checkpoint_path needs weight_version: a disk copy must name its version",
                                            field="checkpoint_path")
            checkpoint = Checkpoint(path=self.ctl.check_path(req.checkpoint_path, "checkpoint_path"),
                                    version=req.weight_version)
        return await self._in_session("finish_weight_update", lambda u: self._finish(u, req, checkpoint))

    async def _finish(self, update: _Update, req: TransferFinishRequest,
                      checkpoint: Checkpoint | None) -> OperationResult:
        ctl, run, s = self.ctl, update.run, self.ctl.settings.weight_transfer
        version = req.weight_version
        run.tracker.detail.update(version=version, chunks=update.chunks)
        finished = await run.step("updating", "finish_weight_update", update.records,
                                  lambda a: a.finish_weight_update(version), s.chunk_timeout_s)
        if len(finished) < len(update.records):
            return await self._abort("a worker failed to finish the update", finished=finished)
        # Every worker holds the new weights: they are the desired state now. Without a
        # version nothing names them yet (the trainer may call update_weight_version).
        ctl.desired.weight_version = version
        ctl.desired.weight_source = BroadcastSource()
        if checkpoint is not None:
            ctl.desired.checkpoint = checkpoint
        await ctl.save_desired()
        short_s = ctl.settings.workers.timeout_s * 2
        tracking = [r for r in update.records if r.tracks_desired]
        for rec in await run.step(None, "set_desired", tracking, lambda a: a.set_desired_version(version), short_s):
            rec.told_desired = version
        verified = update.records
        if version is not None and s.verify:
            verified = await _verify(run, update.records, version, short_s)
        ctl.verified = version is not None and s.verify and len(verified) == len(ctl.members())
        if update.paused_by_us and not ctl.desired.paused:
            await run.step("resuming", "resume", verified, lambda a: a.resume(), short_s)
        return await self._close(update)

    async def update_weight_version(self, version: str) -> OperationResult:
        """Name the weights every member holds (vLLM's `/update_weight_version`)."""
        ctl = self.ctl

        async def body(run: _Run) -> None:
            ctl.desired.weight_version = version
            await ctl.save_desired()
            await run.step(None, "update_weight_version", run.members, lambda a: a.update_weight_version(version),
                           ctl.settings.workers.timeout_s * 2)

        return await _run_operation(ctl, "weight_transfer_update", {"version": version, "rename_only": True}, body)

    def forget(self, reason: str) -> None:
        """Drop the group and any open update without touching a worker: in a new leadership
        term another replica may have driven the workers since, so neither is ours to go
        on with. The trainer's next call gets 409 and it initialises again."""
        if self.group is None and self.update is None:
            return
        log.warning("weight_transfer_forgotten", reason=reason)
        update, self.update, self.group = self.update, None, None
        if update is not None:
            self.ctl.gate.end_session()
            if update.watchdog is not None:
                update.watchdog.cancel()
            update.run.tracker.detail.update(aborted=reason)
            update.run.close()

    # -- internals ----------------------------------------------------------------------------
    async def _in_session(self, phase: str,
                          call: Callable[[_Update], Awaitable[OperationResult]]) -> OperationResult:
        ctl = self.ctl
        if self.update is None:
            raise ConflictError(f"{phase}: no weight update is open; call start_weight_update first")
        async with ctl.gate.api_operation(SESSION, in_session=True):
            update = self.update
            if update is None:  # aborted by the idle watchdog while this call waited
                raise ConflictError(f"{phase}: the weight update was aborted; start again")
            update.last_call = time.monotonic()
            with self._bound(update.run):
                assert self.group is not None
                if (change := self._change(self.group)) is not None:
                    await self._abort(f"membership changed during the update: {change}")
                    raise MembershipChangedError(f"{change}; initialise the weight transfer again")
                try:
                    return await call(update)
                finally:
                    update.last_call = time.monotonic()

    def _require_group(self) -> _Group:
        if self.group is None:
            raise ConflictError("no weight-transfer group: call init_weight_transfer_engine first")
        if (change := self._change(self.group)) is not None:
            raise MembershipChangedError(f"{change}; initialise the weight transfer again")
        return self.group

    def _change(self, group: _Group) -> str | None:
        """Why the group no longer matches the fleet, or None when it still does."""
        ctl = self.ctl
        ids = {m.worker_id for m in group.members}
        if added := sorted(set(ctl.records) - ids):
            return f"members added since init: {', '.join(added)}"
        if removed := sorted(ids - set(ctl.records)):
            return f"members removed since init: {', '.join(removed)}"
        if ctl.membership.epoch != group.epoch:
            return f"membership epoch is {ctl.membership.epoch}, the group was formed at {group.epoch}"
        for m in group.members:
            status = ctl.records[m.worker_id].status
            if status is not None and m.instance_id is not None and status.instance_id != m.instance_id:
                return f"worker {m.worker_id} restarted since init"
        return None

    async def _abort(self, reason: str, *, finished: list[WorkerRecord] | None = None) -> OperationResult:
        """End the open update after a failure; see the module docstring for what each worker gets."""
        update = self.update
        assert update is not None
        ctl, run, short_s = self.ctl, update.run, self.ctl.settings.workers.timeout_s * 2
        log.warning("weight_transfer_aborted", reason=reason, chunks=update.chunks)
        run.tracker.detail.update(aborted=reason, chunks=update.chunks)
        self.group = None  # a collective that failed part-way cannot be trusted: init again
        done = {r.spec.id for r in finished or []}
        alive = [r for r in update.records if r.spec.id not in done and _ok_so_far(run, r.spec.id)]
        # finish restores the engine's layers (a reload left open would kill the next forward pass).
        await self._best_effort(run, "abort:finish_weight_update", alive, lambda a: a.finish_weight_update(None),
                                ctl.settings.weight_transfer.chunk_timeout_s)
        if update.paused_by_us and not ctl.desired.paused and update.chunks == 0:
            intact = [r for r in update.records if _ok_so_far(run, r.spec.id)]
            await run.step("resuming", "resume", intact, lambda a: a.resume(), short_s)
        return await self._close(update)

    async def _best_effort(self, run: _Run, phase: str, records: list[WorkerRecord],
                           fn: Callable[[AdminAPI], Awaitable[Any]], deadline_s: float) -> None:
        """A clean-up step whose failures do not replace the worker's first error."""
        outcomes = await self.ctl.fanout.run([r.api for r in records], fn, phase=phase, deadline_s=deadline_s)
        for o in outcomes:
            if o.ok:
                run.tracker.results[o.worker_id] = o.result
            else:
                first = run.tracker.results.get(o.worker_id)
                note = f"; then {phase} failed: {o.result.message}"
                if first is not None and first.status != "ok":
                    run.tracker.results[o.worker_id] = first.model_copy(update={"message": (first.message or "") + note})
                else:
                    run.tracker.results[o.worker_id] = o.result

    async def _close(self, update: _Update) -> OperationResult:
        self.update = None
        self.ctl.gate.end_session()
        if update.watchdog is not None and update.watchdog is not asyncio.current_task():
            update.watchdog.cancel()
        result = update.run.close()
        await self.ctl.poll_statuses(update.run.answering(update.records))
        return result

    async def _watch_idle(self, update: _Update) -> None:
        """Abort an update the trainer stopped driving, so the fleet is not left paused."""
        idle_s = self.ctl.settings.weight_transfer.idle_timeout_s
        while self.update is update:
            if not self.ctl.leadership.is_leader:
                return  # a follower touches no worker; a later term of ours forgets the update
            wait = update.last_call + idle_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            with contextlib.suppress(ConflictError):
                async with self.ctl.gate.api_operation(SESSION, in_session=True):
                    if self.update is update and time.monotonic() - update.last_call >= idle_s:
                        with self._bound(update.run):
                            await self._abort(f"no call from the trainer for {idle_s:g}s")
                        return
            await asyncio.sleep(min(1.0, idle_s))  # a call is in flight: look again after it

    def _bound(self, run: _Run) -> contextlib.AbstractContextManager[Any]:
        return structlog.contextvars.bound_contextvars(operation_id=run.tracker.id, operation=SESSION)

    @staticmethod
    def _world_size(rec: WorkerRecord) -> int:
        if rec.status is not None and rec.status.world_size:
            return rec.status.world_size
        return rec.spec.world_size


def _ok_so_far(run: _Run, worker_id: str) -> bool:
    result = run.tracker.results.get(worker_id)
    return result is None or result.status == "ok"

"""Fleet operations, each one call from a trainer or operator.

The update transaction is: gate -> pause(mode) -> update -> verify -> resume.
- Desired state is persisted before any worker is touched, so a controller killed
  mid-transaction converges the fleet to it after a restart.
- Workers are told the desired version first: a stale one reports not ready at once.
- A worker failing a step drops out of the later steps and stays paused (out of
  service, its frozen requests kept); the rest resume; the reconciler retries it.
- Verify: every updated worker reports the version, and where it can compute them,
  weight checksums agree; a minority that disagrees fails verification.
Re-sending a version the fleet already has is a no-op success.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from agents.errors import NotFoundError
from controlplane.adminapi.base import AdminAPI
from controlplane.errors import NoMembersError
from controlplane.fanout import Outcome
from controlplane.operations import OperationTracker
from controlplane.state import (Checkpoint, LoraRequest, LoraSpec, OperationKind, OperationResult, Phase,
                                PauseRequest, UpdateWeightsRequest)

if TYPE_CHECKING:
    from controlplane.controller import Controller, WorkerRecord

log = structlog.get_logger("controlplane.transaction")
T = TypeVar("T")


class _Run:
    """One operation in progress: tracker, phase, and fan-out over a set of workers."""

    def __init__(self, ctl: Controller, kind: OperationKind, detail: dict[str, Any]) -> None:
        self.ctl = ctl
        self.tracker = OperationTracker(kind, epoch=ctl.membership.epoch, detail=detail)
        self.members = ctl.members()
        if not self.members:
            raise NoMembersError("the fleet has no members")

    async def step(self, phase: Phase | None, name: str, records: list[WorkerRecord],
                   fn: Callable[[AdminAPI], Awaitable[T]], deadline_s: float) -> list[WorkerRecord]:
        """Run `fn` on `records`; record results; return the records that succeeded."""
        if phase is not None:
            self.ctl.set_phase(phase)
        outcomes: list[Outcome[T]] = await self.ctl.fanout.run([r.api for r in records], fn, phase=name,
                                                               deadline_s=deadline_s)
        self.tracker.record(outcomes)
        ok = {o.worker_id for o in outcomes if o.ok}
        for o in outcomes:
            rec = self.ctl.records.get(o.worker_id)
            if rec is not None:
                rec.last_result = o.result
                if not o.ok:
                    self.ctl.metrics.worker_failures.labels(o.worker_id, name).inc()
        self.ctl.touch()
        return [r for r in records if r.spec.id in ok]


    def close(self) -> OperationResult:
        """Finish the record: the result joins the history, the phase clears."""
        result = self.tracker.finish()
        ctl = self.ctl
        ctl.current, ctl.last_operation = None, result
        ctl.history.append(result)
        ctl.set_phase(None)
        ctl.metrics.operation_duration.labels(result.kind, result.status).observe(result.duration_s or 0)
        log.info("operation", status=result.status, duration_s=result.duration_s,
                 failed=[r.worker_id for r in result.results if r.status in ("error", "timeout")])
        return result

    def answering(self, records: list[WorkerRecord]) -> list[WorkerRecord]:
        """The records worth a fresh status read before answering: a worker that just ran
        past a deadline would likely make the trainer wait for another one (the background
        poller reads it when it answers)."""
        timed_out = {r.worker_id for r in self.tracker.results.values() if r.status == "timeout"}
        return [r for r in records if r.spec.id not in timed_out]


async def _run_operation(ctl: Controller, kind: OperationKind, detail: dict[str, Any],
                         body: Callable[[_Run], Awaitable[None]]) -> OperationResult:
    async with ctl.gate.api_operation(kind):
        run = _Run(ctl, kind, detail)
        ctl.current = run.tracker
        with structlog.contextvars.bound_contextvars(operation_id=run.tracker.id, operation=kind):
            try:
                await body(run)
            finally:
                result = run.close()
        # Refresh the cache so the state endpoint (and the reconciler) see the outcome now.
        await ctl.poll_statuses(run.answering(run.members))
        return result


def _deadlines(ctl: Controller, timeout_s: float | None) -> tuple[float, float, float]:
    w = ctl.settings.workers
    pause = timeout_s or w.pause_timeout_s
    return pause, (timeout_s or w.weight_load_timeout_s), w.timeout_s * 2


async def update_weights(ctl: Controller, req: UpdateWeightsRequest) -> OperationResult:
    path = ctl.check_path(req.source.path, "source.path")
    detail = {"version": req.version, "path": path, "pause_mode": req.pause_mode, "verify": req.verify}

    async def body(run: _Run) -> None:
        pause_s, load_s, short_s = _deadlines(ctl, req.timeout_s)
        members = run.members
        if ctl.desired.weight_version == req.version:
            # Read fresh: the cache may predate a worker's restart onto base weights.
            await ctl.poll_statuses(members)
        already = [r for r in members if r.reachable and r.status is not None
                   and r.status.weight_version == req.version]
        if ctl.desired.weight_version == req.version and len(already) == len(members):
            for r in members:
                run.tracker.skip(r.spec.id, "gate", f"already at version {req.version!r}")
            detail["noop"] = True
            return
        ctl.desired.weight_version = req.version
        ctl.desired.weight_source = req.source.model_copy(update={"path": path})
        ctl.desired.checkpoint = Checkpoint(path=path, version=req.version)
        ctl.verified = False
        await ctl.save_desired()
        tracking = [r for r in members if r.tracks_desired]
        told = await run.step(None, "set_desired", tracking, lambda a: a.set_desired_version(req.version),
                              short_s)
        for r in told:
            r.told_desired = req.version

        paused = await run.step("pausing", "pause", members, lambda a: a.pause(req.pause_mode, pause_s),
                                pause_s + 5)
        updated = await run.step("updating", "update", paused,
                                 lambda a: a.update_weights_from_disk(path, req.version), load_s + 5)
        verified = await _verify(run, updated, req.version, short_s) if req.verify else updated
        ctl.verified = req.verify and len(verified) == len(members)
        if not ctl.desired.paused:
            await run.step("resuming", "resume", verified, lambda a: a.resume(), short_s)

    return await _run_operation(ctl, "update_weights", detail, body)


async def _verify(run: _Run, records: list[WorkerRecord], version: str, deadline_s: float) -> list[WorkerRecord]:
    async def reports_version(api: AdminAPI) -> None:
        status = await api.status()
        if status.weight_version != version:
            raise _mismatch(api, f"reports weight version {status.weight_version!r}, expected {version!r}")

    at_version = await run.step("verifying", "verify", records, reports_version, deadline_s)
    outcomes = await run.ctl.fanout.run([r.api for r in at_version], lambda a: a.weight_checksums(),
                                        phase="verify", deadline_s=deadline_s * 10)
    digests = {o.worker_id: _digest(o.value) for o in outcomes if o.ok and o.value}
    run.tracker.record(o for o in outcomes if not o.ok)
    failed = {o.worker_id for o in outcomes if not o.ok}
    if digests:
        majority, count = Tally(digests.values()).most_common(1)[0]
        for worker_id, digest in digests.items():
            if digest != majority:
                failed.add(worker_id)
                run.tracker.results[worker_id] = run.tracker.results[worker_id].model_copy(update={
                    "status": "error", "phase": "verify",
                    "message": f"weight checksums differ from {count} other worker(s) at version {version!r}"})
    run.ctl.touch()
    return [r for r in at_version if r.spec.id not in failed]


def _digest(checksums: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()


def _mismatch(api: AdminAPI, reason: str) -> Exception:
    from controlplane.adminapi.http import WorkerRejected

    return WorkerRejected(api.spec.id, reason)


async def pause(ctl: Controller, req: PauseRequest) -> OperationResult:
    async def body(run: _Run) -> None:
        deadline = req.timeout_s or ctl.settings.workers.pause_timeout_s
        ctl.desired.paused, ctl.desired.pause_mode = True, req.mode
        await ctl.save_desired()
        await run.step("pausing", "pause", run.members, lambda a: a.pause(req.mode, deadline), deadline + 5)

    return await _run_operation(ctl, "pause", {"mode": req.mode}, body)


async def resume(ctl: Controller) -> OperationResult:
    async def body(run: _Run) -> None:
        ctl.desired.paused = False
        await ctl.save_desired()
        await run.step("resuming", "resume", run.members, lambda a: a.resume(), ctl.settings.workers.timeout_s * 2)

    return await _run_operation(ctl, "resume", {}, body)


async def load_lora(ctl: Controller, req: LoraRequest) -> OperationResult:
    path = ctl.check_path(req.path, "path")

    async def body(run: _Run) -> None:
        ctl.desired.loras[req.name] = LoraSpec(path=path, version=req.version)
        await ctl.save_desired()
        await run.step(None, "load_lora", run.members, lambda a: a.load_lora(req.name, path, req.version),
                       ctl.settings.workers.timeout_s * 3)

    return await _run_operation(ctl, "load_lora", {"name": req.name, "version": req.version, "path": path}, body)


async def unload_lora(ctl: Controller, name: str) -> OperationResult:
    if name not in ctl.desired.loras and not any(r.status and name in r.status.loras for r in ctl.members()):
        raise NotFoundError(f"no LoRA named {name!r} in the fleet", field="name")

    async def body(run: _Run) -> None:
        ctl.desired.loras.pop(name, None)
        await ctl.save_desired()
        await run.step(None, "unload_lora", run.members, lambda a: a.unload_lora(name),
                       ctl.settings.workers.timeout_s * 3)

    return await _run_operation(ctl, "unload_lora", {"name": name}, body)

"""The controller: membership, each worker's observed state, the desired state, and the
loops that keep them together.

Three background loops (started by the app, see `api/app.py`): the discovery consumer
applies member lists; the poller reads every member's status into a cache (the state
endpoint serves that cache, it never fans out per request); the reconciler brings
workers that are behind to the desired state. API operations (`transaction.py`) run
one at a time through the `OperationGate`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import structlog

from agents.errors import BadRequestError, ForbiddenPathError
from controlplane.adminapi.base import AdminAPI, WorkerStatus
from controlplane.adminapi.factory import make_admin_api
from controlplane.adminapi.http import CallPolicy, WorkerHTTP
from controlplane.discovery.base import DiscoverySource, Membership
from controlplane.fanout import FanOut, Outcome
from controlplane.errors import NotLeaderError
from controlplane.gate import OperationGate
from controlplane.k8s.leadership import Leadership
from controlplane.metrics import ControllerMetrics
from controlplane.operations import OperationTracker
from controlplane.reconcile import Action, converged, plan
from controlplane.settings import ControllerSettings
from controlplane.state import (AppliedState, DesiredState, FleetState, OperationResult, Phase, RequestCounts,
                                WorkerResult, WorkerView)
from controlplane.store import DesiredStore
from controlplane.workers import WorkerSpec

log = structlog.get_logger("controlplane.controller")
_NEVER = object()  # "never told a desired version", distinct from None


@dataclass
class WorkerRecord:
    spec: WorkerSpec
    api: AdminAPI
    status: WorkerStatus | None = None
    reachable: bool = False
    last_seen: datetime | None = None
    last_error: str | None = None
    last_result: WorkerResult | None = None
    told_desired: Any = _NEVER
    failures: int = 0
    next_attempt: float = 0.0  # monotonic time before which the reconciler leaves it alone

    @property
    def tracks_desired(self) -> bool:
        return self.spec.flavor == "agent"


class Controller:
    def __init__(self, settings: ControllerSettings, *, session: aiohttp.ClientSession, store: DesiredStore,
                 source: DiscoverySource, leadership: Leadership | None = None) -> None:
        self.settings = settings
        self.session = session
        self.store = store
        self.source = source
        # Without leader election this replica always leads: the single-controller behaviour.
        self.leadership = leadership or Leadership.always(settings.controller_id)
        self._desired_term = -1  # the leadership term the desired state was last loaded in
        self._desired_lock = asyncio.Lock()
        self.membership = Membership()
        self.records: dict[str, WorkerRecord] = {}
        self.desired = DesiredState()
        self.gate = OperationGate()
        self.fanout = FanOut(settings.workers.max_concurrency)
        self.metrics = ControllerMetrics()
        self.current: OperationTracker | None = None
        self.current_phase: Phase | None = None
        self.last_operation: OperationResult | None = None
        self.history: deque[OperationResult] = deque(maxlen=64)  # newest last
        self.verified = False
        # The serialized state document and the key it was built for (see `state_json`).
        self._state_generation = 0
        self._state_cache: tuple[tuple[Any, ...], bytes] | None = None
        w = settings.workers
        self._policy = CallPolicy(timeout_s=w.timeout_s, attempts=w.attempts, retry_budget_s=w.retry_budget_s)
        self._worker_token = w.resolved_token()
        from controlplane.broadcast import WeightTransfer  # it builds on transaction, which types on us

        self.transfer = WeightTransfer(self)

    async def load_desired(self) -> None:
        self._desired_term = self.leadership.term
        stored = await self.store.load()
        if stored is not None:
            self.desired = stored
            log.info("desired_state_recovered", version=stored.weight_version, loras=sorted(stored.loras),
                     paused=stored.paused)

    async def ensure_leading(self) -> None:
        """Refuse (409 `not_leader`, naming the leader) unless this replica leads. The first
        time in a new term, reload the desired state: the previous leader may have changed it."""
        self.leadership.require()
        if self._desired_term != self.leadership.term:
            async with self._desired_lock:
                if self._desired_term != self.leadership.term:
                    await self.load_desired()
                    self.transfer.forget("a new leadership term began")
        self.leadership.require()  # leadership may have gone while the store answered

    async def follow_desired(self) -> None:
        """A follower's view of the desired state: re-read what the leader wrote, so reads served
        here are not stale."""
        stored = await self.store.load()
        if stored is not None and stored != self.desired:
            self.desired = stored
            log.info("desired_state_followed", version=stored.weight_version, leader=self.leadership.leader_identity)

    async def save_desired(self) -> None:
        self.touch()
        self.desired.updated_at = datetime.now(UTC)
        await self.store.save(self.desired)
        self.metrics.desired_version.info({"version": self.desired.weight_version or ""})

    # -- membership ---------------------------------------------------------------------
    def apply_membership(self, specs: list[WorkerSpec]) -> None:
        self.touch()  # the first list marks discovery synced, even an unchanged one
        change = self.membership.apply(specs)
        if change is None:
            return
        for spec in change.removed:
            self.records.pop(spec.id, None)
        for spec in (*change.added, *change.changed):
            http = WorkerHTTP(session=self.session, worker_id=spec.id, base_url=spec.admin_url,
                              token=self._worker_token, policy=self._policy)
            api = make_admin_api(spec, http, weight_load_timeout_s=self.settings.workers.weight_load_timeout_s)
            self.records[spec.id] = WorkerRecord(spec=spec, api=api)
        self.metrics.membership(len(self.records), self.membership.epoch)
        log.info("membership_changed", epoch=change.epoch, added=[s.id for s in change.added],
                 removed=[s.id for s in change.removed], changed=[s.id for s in change.changed])

    def members(self) -> list[WorkerRecord]:
        return [self.records[k] for k in sorted(self.records)]

    async def run_discovery(self) -> None:
        async for specs in self.source.watch():
            self.apply_membership(specs)

    # -- observation ----------------------------------------------------------------------
    async def poll_statuses(self, records: list[WorkerRecord] | None = None) -> None:
        targets = records if records is not None else self.members()
        outcomes = await self.fanout.run([r.api for r in targets], lambda api: api.status(), phase="status",
                                         deadline_s=self.settings.workers.timeout_s * 2, quiet=True)
        for outcome in outcomes:
            self._observe(outcome)

    def _observe(self, outcome: Outcome[WorkerStatus]) -> None:
        self.touch()
        rec = self.records.get(outcome.worker_id)
        if rec is None:
            return  # removed while the call was in flight
        if outcome.ok and outcome.value is not None:
            if rec.status is not None and outcome.value.instance_id != rec.status.instance_id:
                # A restarted worker remembers nothing we told it.
                rec.told_desired = _NEVER
                log.info("worker_restarted", worker_id=rec.spec.id)
            if not rec.reachable:
                log.info("worker_reachable", worker_id=rec.spec.id)
            rec.status, rec.reachable = outcome.value, True
            rec.last_seen, rec.last_error = datetime.now(UTC), None
        else:
            if rec.reachable or rec.last_seen is None and rec.last_error is None:
                log.warning("worker_unreachable", worker_id=rec.spec.id, error=outcome.result.message)
            rec.reachable, rec.last_error = False, outcome.result.message

    async def run_poller(self, *, iterations: int | None = None) -> None:
        """Read every member's status into the cache every `poll_interval_s`. A read still
        running at the end of its tick is left to finish (its result lands when it does) and its
        worker is skipped until then: a worker that hangs until its deadline delays only its own
        status, where waiting for every read would refresh the whole fleet once per deadline."""
        interval, deadline_s = self.settings.reconcile.poll_interval_s, self.settings.workers.timeout_s * 2
        running: dict[str, asyncio.Task[Outcome[WorkerStatus]]] = {}
        n = 0
        try:
            while iterations is None or n < iterations:
                n += 1
                tick = time.monotonic()
                for rec in self.members():
                    if rec.spec.id not in running:
                        running[rec.spec.id] = asyncio.create_task(
                            self.fanout.call(rec.api, lambda api: api.status(), phase="status", deadline_s=deadline_s,
                                             quiet=True), name=f"status-poll:{rec.spec.id}")
                if running:
                    await asyncio.wait(running.values(), timeout=interval)
                for worker_id, task in list(running.items()):
                    if task.done():  # observed together: one rebuild of the state document per tick
                        del running[worker_id]
                        self._observe(task.result())
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - tick)))
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)

    # -- reconciliation ---------------------------------------------------------------------
    def needs_work(self, rec: WorkerRecord) -> bool:
        return bool(rec.reachable and rec.status is not None and
                    plan(self.desired, rec.status, told_desired=rec.told_desired, tracks_desired=rec.tracks_desired))

    async def reconcile_once(self) -> int:
        """One pass over the workers that are behind; returns how many were acted on. Only the
        leader reconciles, and a loss of leadership cancels a pass halfway."""
        if not self.leadership.is_leader:
            return 0
        await self.ensure_leading()
        return await self.leadership.run_as_leader(self._reconcile_pass(), name="reconcile-pass")

    async def _reconcile_pass(self) -> int:
        now = time.monotonic()
        async with self.gate.reconcile_pass() as held:
            if not held:
                return 0
            due = [r for r in self.members() if self.needs_work(r) and now >= r.next_attempt]
            if not due:
                return 0
            await asyncio.gather(*(self._reconcile_worker(r) for r in due))
            return len(due)

    async def _reconcile_worker(self, rec: WorkerRecord) -> None:
        with structlog.contextvars.bound_contextvars(worker_id=rec.spec.id, operation="reconcile"):
            fresh = await self.fanout.call(rec.api, lambda api: api.status(), phase="status",
                                           deadline_s=self.settings.workers.timeout_s * 2, quiet=True)
            self._observe(fresh)
            if not fresh.ok or rec.status is None:
                return
            for action in plan(self.desired, rec.status, told_desired=rec.told_desired,
                               tracks_desired=rec.tracks_desired):
                if self.gate.api_waiting:
                    return  # an API operation is waiting: finish later
                outcome = await self.fanout.call(rec.api, lambda api, a=action: self._act(api, a),
                                                 phase=f"reconcile:{action.kind}", deadline_s=self._deadline(action))
                rec.last_result = outcome.result
                self.touch()
                if not outcome.ok:
                    rec.failures += 1
                    delay = min(self.settings.reconcile.backoff_max_s,
                                self.settings.reconcile.backoff_initial_s * 2 ** (rec.failures - 1))
                    rec.next_attempt = time.monotonic() + delay * random.uniform(0.5, 1.0)
                    self.metrics.worker_failures.labels(rec.spec.id, outcome.result.phase).inc()
                    return
                if action.kind == "set_desired":
                    rec.told_desired = action.args["version"]
            rec.failures, rec.next_attempt = 0, 0.0
            log.info("worker_reconciled", version=self.desired.weight_version)
            await self.poll_statuses([rec])

    def _deadline(self, action: Action) -> float:
        w = self.settings.workers
        if action.kind == "update_weights":
            return w.weight_load_timeout_s + w.timeout_s
        if action.kind == "pause":
            return w.pause_timeout_s + w.timeout_s
        return w.timeout_s * 2

    async def _act(self, api: AdminAPI, action: Action) -> None:
        a = action.args
        match action.kind:
            case "set_desired":
                await api.set_desired_version(a["version"])
            case "update_weights":
                await api.update_weights_from_disk(a["path"], a["version"])
            case "load_lora":
                await api.load_lora(a["name"], a["path"], a["version"])
            case "unload_lora":
                await api.unload_lora(a["name"])
            case "pause":
                await api.pause(a["mode"], self.settings.workers.pause_timeout_s)
            case "resume":
                await api.resume()

    async def run_reconciler(self, *, iterations: int | None = None) -> None:
        n = 0
        while iterations is None or n < iterations:
            n += 1
            try:
                if self.leadership.is_leader:
                    await self.reconcile_once()
                else:
                    await self.follow_desired()
            except NotLeaderError as exc:
                log.info("reconcile_pass_stopped", reason=exc.message)
            except Exception:  # one bad pass must not end reconciliation for good
                log.exception("reconcile_pass_failed")
            await asyncio.sleep(self.settings.reconcile.interval_s)

    # -- helpers for operations ---------------------------------------------------------------
    def check_path(self, raw: str, field: str) -> str:
        """Check a path against the allowed roots before any worker is touched: lexically, and
        with symlinks resolved as far as the controller sees the path (a shared mount), so a link
        out of a root is refused here, not by every worker. Workers resolve it again themselves:
        the controller may not mount the weights."""
        import os.path
        import posixpath

        if "\x00" in raw:
            raise BadRequestError("path contains a NUL byte", field=field)
        if not raw.startswith("/"):
            raise ForbiddenPathError(f"path must be absolute: {raw!r}", field=field)
        normalized = posixpath.normpath(raw)
        roots = [posixpath.normpath(str(r.resolve())) for r in self.settings.allowed_roots]

        def inside(path: str) -> bool:
            return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

        if not inside(normalized) or not inside(os.path.realpath(normalized)):
            raise ForbiddenPathError(f"path {raw!r} is outside the allowed roots", field=field)
        return normalized

    def set_phase(self, phase: Phase | None) -> None:
        self.current_phase = phase
        self.touch()

    # -- state ------------------------------------------------------------------------------------
    def touch(self) -> None:
        """Something the state document shows has changed: the next read rebuilds it."""
        self._state_generation += 1

    def state_json(self) -> bytes:
        """`state()` serialized, rebuilt only when something it shows has changed.

        Trainers and dashboards poll this document, many times a second each, while with
        hundreds of members building and serializing it takes milliseconds: it is built once
        per change (a status poll, a step of an operation, a membership or desired-state
        change: `touch`) and served as bytes until the next one. The key also holds what an
        operation changes in place, so a missed `touch` cannot serve an old phase or result.
        """
        cur, transfer = self.current, self.transfer
        key = (self._state_generation, self.current_phase, id(cur), len(cur.results) if cur else -1,
               id(self.last_operation), self.verified, id(self.desired), self.desired.updated_at,
               self.membership.epoch, self.membership.synced, id(transfer.group), id(transfer.update),
               transfer.update.chunks if transfer.update else -1)
        cached = self._state_cache
        if cached is None or cached[0] != key:
            cached = self._state_cache = (key, self.state().model_dump_json().encode())
        return cached[1]

    def worker_view(self, rec: WorkerRecord) -> WorkerView:
        s = rec.status
        at_desired = bool(s is not None and converged(self.desired, s))
        ready = bool(rec.reachable and s is not None and s.ready is not False and at_desired)
        reason = None
        if not rec.reachable:
            reason = rec.last_error or "not reached yet"
        elif s is not None and s.ready is False:
            reason = s.not_ready_reason or "worker reports not ready"
        elif not at_desired:
            reason = f"at weight version {s.weight_version if s else None!r}, desired {self.desired.weight_version!r}"
        return WorkerView(
            id=rec.spec.id, admin_url=rec.spec.admin_url, inference_url=rec.spec.inference_url,
            flavor=rec.spec.flavor, world_size=(s.world_size if s and s.world_size else rec.spec.world_size),
            reachable=rec.reachable, ready=ready, serving=ready and s is not None and s.paused is False,
            paused=s.paused if s else None, requests=s.requests if s else None,
            weight_version=s.weight_version if s else None, loras=s.loras if s else {},
            not_ready_reason=None if ready else reason, last_result=rec.last_result, last_seen=rec.last_seen,
            last_error=rec.last_error)

    def state(self) -> FleetState:
        views = [self.worker_view(r) for r in self.members()]
        known = [v for v in views if v.reachable and v.paused is not None]
        paused = [v.paused for v in known]
        pause_state = "paused" if paused and all(paused) else ("running" if not any(paused) else "mixed")
        counts = [v.requests for v in views if v.requests is not None]
        totals = RequestCounts(running=sum(c.running for c in counts), waiting=sum(c.waiting for c in counts),
                               frozen=sum(c.frozen for c in counts))
        quiesced = bool(views) and all(v.reachable and v.paused for v in views) and totals.running == 0
        versions = {v.weight_version for v in views}
        common = versions.pop() if len(versions) == 1 and views else None
        all_converged = bool(views) and all(v.ready for v in views)
        if self.current_phase is not None:
            phase: Phase = self.current_phase
        elif not views or not any(v.ready for v in views):
            phase = "failed"
        elif not all_converged:
            phase = "degraded"
        elif self.desired.paused and pause_state == "paused":
            phase = "paused"
        else:
            phase = "serving"
        last = self.current.snapshot() if self.current is not None else self.last_operation
        return FleetState(
            phase=phase, quiesced=quiesced, pause_state=pause_state, requests=totals,  # type: ignore[arg-type]
            desired=self.desired,
            applied=AppliedState(weight_version=common, converged=all_converged,
                                 verified=self.verified and all_converged),
            membership_epoch=self.membership.epoch, discovery_synced=self.membership.synced,
            last_operation=last, weight_transfer=self.transfer.view(), workers=views)

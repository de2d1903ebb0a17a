"""The reconciler: brings workers that are behind to the desired state, one pass at a time.

Level-triggered: each pass compares every reachable member's last status with the desired
state (`plan.py`, pure) and runs the planned actions in order, stopping a worker's plan at
its first failure. When to try a failing worker again is the rate limiter's business
(`ratelimit.py`). Only the leader acts, through the gate (an API operation waiting makes
the pass stop between actions), and a loss of leadership cancels a pass halfway.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import structlog

from rlcp.controlplane.deadlines import Deadlines
from rlcp.controlplane.errors import NotLeader
from rlcp.controlplane.fleet.desired import DesiredKeeper
from rlcp.controlplane.fleet.members import FleetRegistry, WorkerRecord
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.metrics import ControllerMetrics, ReconcileStep
from rlcp.controlplane.operations.gate import OperationGate
from rlcp.controlplane.operations.steps import Executor, StepDone
from rlcp.controlplane.operations.transaction import Ask, Call, Effect, Refresh, perform_unrecorded
from rlcp.controlplane.reconcile import plan as actions
from rlcp.controlplane.reconcile.plan import Action, ActionKind, plan
from rlcp.controlplane.reconcile.ratelimit import WorkerRateLimiter
from rlcp.controlplane.workers.capabilities import DRIVER, Control, DesiredVersion, DiskWeights, Driver, Lora, Sleep
from rlcp.controlplane.workers.fanout import FanOut
from rlcp.controlplane.workers.steps import Step

log = structlog.get_logger("rlcp.controlplane.reconcile")
# Each action's step: its result's phase and the metrics' label (`reconcile:<kind>`).
RECONCILE_STEPS: dict[ActionKind, ReconcileStep] = {
    "set_desired": "reconcile:set_desired",
    "update_weights": "reconcile:update_weights",
    "load_lora": "reconcile:load_lora",
    "unload_lora": "reconcile:unload_lora",
    "pause": "reconcile:pause",
    "resume": "reconcile:resume",
    "sleep": "reconcile:sleep",
}


class Reconciler:
    def __init__(
        self,
        *,
        registry: FleetRegistry,
        desired: DesiredKeeper,
        gate: OperationGate,
        fanout: FanOut,
        deadlines: Deadlines,
        leadership: Leadership,
        limiter: WorkerRateLimiter,
        metrics: ControllerMetrics,
        refresh: Callable[[list[WorkerRecord]], Awaitable[None]],
        ensure_leading: Callable[[], Awaitable[None]],
    ) -> None:
        self.registry, self.desired, self.gate, self.fanout = registry, desired, gate, fanout
        self.deadlines, self.leadership, self.limiter, self.metrics = deadlines, leadership, limiter, metrics
        self._refresh, self._ensure_leading = refresh, ensure_leading
        # The operations' executor, without an operation record: each action's result lands on
        # its worker, a failure in the metrics.
        self.steps = Executor(fanout=fanout, registry=registry, metrics=metrics)
        # The read before a worker's actions: quiet (the status polls log reachability changes).
        self._status = Step(name="status", can=DRIVER, call=lambda d: d.status(), deadline_s=deadlines.control_s)

    def plan_for(self, rec: WorkerRecord) -> list[Action]:
        if not rec.reachable or rec.status is None:
            return []
        return plan(
            self.desired.state,
            rec.status,
            told_desired=rec.told_desired,
            tracks_desired=rec.tracks_desired,
            worker_id=rec.id,
        )

    def needs_work(self, rec: WorkerRecord) -> bool:
        return bool(self.plan_for(rec))

    async def reconcile_once(self) -> int:
        """One pass over the workers that are behind; returns how many were acted on."""
        if not self.leadership.is_leader:
            return 0
        await self._ensure_leading()
        return await self.leadership.run_as_leader(self._pass(), name="reconcile-pass")

    async def _pass(self) -> int:
        async with self.gate.reconcile_pass() as held:
            if not held:
                return 0
            due = [r for r in self.registry.members() if self.needs_work(r) and self.limiter.due(r.id)]
            if not due:
                return 0
            await asyncio.gather(*(self._reconcile_worker(r) for r in due))
            return len(due)

    async def _reconcile_worker(self, rec: WorkerRecord) -> None:
        with structlog.contextvars.bound_contextvars(worker_id=rec.id, operation="reconcile"):
            await perform_unrecorded(self.steps, self._refresh, self._reconciling(rec))

    def _reconciling(self, rec: WorkerRecord) -> Generator[Effect, Any, None]:
        """One worker's pass, declared: its status read, then its plan's actions in order, each
        one step, stopping at the first failure (the limiter's backoff) or when an API operation
        waits; once every action is done, its status read again."""
        sent = time.monotonic()
        [fresh] = yield Ask(self._status, [rec])
        self.registry.observe(fresh, sent_at=sent)
        if not fresh.ok or rec.status is None:
            return
        for action in self.plan_for(rec):
            if self.gate.api_waiting:
                return  # an API operation is waiting: finish later
            done: StepDone[None] = yield Call(self._step(action), [rec])
            if not done.ok:
                self.limiter.when(rec.id)
                return
            if isinstance(action, actions.SetDesired):
                self.registry.told(rec.id, action.version)
        self.limiter.forget(rec.id)
        log.info("worker_reconciled", version=self.desired.state.weight_version)
        yield Refresh([rec])

    def _step(self, action: Action) -> Step[Driver, None]:
        return Step(
            name=RECONCILE_STEPS[action.kind],
            can=DRIVER,
            call=functools.partial(self._act, action=action),
            deadline_s=self.deadlines.reconcile_action(action.kind),
        )

    async def _act(self, d: Driver, action: Action) -> None:
        """The plan only asks a driver for what its capabilities allow; one that lacks the
        capability an action needs fails that action (naming both) instead of being called."""
        match action, d:
            case actions.SetDesired(version=version), DesiredVersion():
                await d.set_desired_version(version)
            case actions.UpdateWeights(path=path, version=version), DiskWeights():
                await d.update_weights_from_disk(path, version)
            case actions.LoadLora(name=name, path=path, version=version), Lora():
                await d.load_lora(name, path, version)
            case actions.UnloadLora(name=name), Lora():
                await d.unload_lora(name)
            case actions.Pause(mode=mode), Control():
                await d.pause(mode, self.deadlines.pause())
            case actions.Resume(), Control():
                await d.resume()
            case actions.PutToSleep(level=level), Sleep():
                # Back to sleep: what it runs is nobody's rollout (it is outside the fence).
                await d.sleep(level, "abort", self.deadlines.pause())
            case _:
                raise TypeError(f"a {type(d).__name__} cannot {action.kind}: the plan asked for a capability it lacks")


async def run_reconciler(
    *,
    reconciler: Reconciler,
    desired: DesiredKeeper,
    leadership: Leadership,
    interval_s: float,
    iterations: int | None = None,
) -> None:
    """Reconcile every `interval_s` while leading; follow the leader's desired state otherwise."""
    n = 0
    while iterations is None or n < iterations:
        n += 1
        try:
            if leadership.is_leader:
                await reconciler.reconcile_once()
            else:
                await desired.follow(leader=leadership.leader_identity)
        except NotLeader as exc:
            log.info("reconcile_pass_stopped", reason=exc.message)
        except Exception:  # one bad pass must not end reconciliation for good
            log.exception("reconcile_pass_failed")
        await asyncio.sleep(interval_s)

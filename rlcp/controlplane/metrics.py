"""Prometheus metrics of the controller, served on /metrics.

A registry per controller (tests run several in one process). Every label value comes from a
closed set declared here or in the wire models (`Literal`s), so the label sets stay small and
fixed: operation kinds and statuses, and the steps an operation or the reconciler runs on
workers (`Step`, `ReconcileStep`). What varies without bound -- a broadcast chunk's number, a
version, a path -- is a value of the operation's record, never a label. The one label that is
not a closed set is the worker id, bounded by the fleet's members.
"""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from rlcp.core.wire.controller.operations import OperationKind, OperationStatus

_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200)

# The steps an operation runs on workers, each one fan-out (`workers.steps.Step`).
Step = Literal[
    "status",
    "check",  # reads: a status, whether a checkpoint is loadable where a worker reads it
    "set_desired",
    "pause",
    "update",
    "verify",
    "resume",  # the disk update, and pause / resume
    "load_lora",
    "unload_lora",
    "init_weight_transfer",
    "start_weight_update",
    "update_weights",
    "finish_weight_update",  # a broadcast
    "update_weight_version",
    "shutdown_weight_transfer",
    "engine",  # the guarded passthrough (operations/engine.py): one allowlisted engine route
    "checksums",
    "sleep",
    "wake_up",  # sleep mode (operations/sleep.py)
    "reset_prefix_cache",  # operations/caches.py
]
# The reconciler's actions on one worker (`reconcile.plan.ActionKind`, as `reconcile:<kind>`).
ReconcileStep = Literal[
    "reconcile:set_desired",
    "reconcile:update_weights",
    "reconcile:load_lora",
    "reconcile:unload_lora",
    "reconcile:pause",
    "reconcile:resume",
    "reconcile:sleep",
]
FailedStep = Step | ReconcileStep | Literal["other"]
_STEPS: dict[str, FailedStep] = {s: s for s in (*get_args(Step), *get_args(ReconcileStep), "other")}
STEPS = frozenset(_STEPS)  # every value the `phase` label of worker failures can take


def failed_step(phase: str) -> FailedStep:
    """The step a result's phase text belongs to: `update_weights[3]` (a broadcast's third
    chunk) is `update_weights`; anything outside the closed set is `other`."""
    return _STEPS.get(phase.partition("[")[0], "other")


class WorkerFailures:
    """`rlcp_worker_failures{worker, phase}`: failed worker calls, by worker and step."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counter = Counter(
            "rlcp_worker_failures", "Failed worker calls by worker and step.", ["worker", "phase"], registry=registry
        )

    def inc(self, worker: str, step: FailedStep) -> None:
        self._counter.labels(worker, step).inc()

    def labels(self, worker: str, phase: str) -> Counter:
        """The counter of a failure known by its result's phase text, held to the closed set."""
        return self._counter.labels(worker, failed_step(phase))


class ControllerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.operation_duration = Histogram(
            "rlcp_operation_duration_seconds",
            "Fleet operations by kind and status.",
            ["kind", "status"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.worker_failures = WorkerFailures(r)
        self.members = Gauge("rlcp_members", "Workers in the fleet.", registry=r)
        self.epoch = Gauge("rlcp_membership_epoch", "Membership epoch.", registry=r)
        self.workers_ready = Gauge("rlcp_workers_ready", "Workers ready at the desired state.", registry=r)
        self.desired_version = Info("rlcp_desired_weight", "Desired weight version.", registry=r)
        self.loop_lag = Histogram(
            "rlcp_event_loop_lag_seconds",
            "How late the event loop woke a timer "
            "(rlcp/controlplane/loopwatch.py): what every request waits on top of its own work.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )

    def operation_finished(self, kind: OperationKind, status: OperationStatus, duration_s: float) -> None:
        self.operation_duration.labels(kind, status).observe(duration_s)

    def membership(self, members: int, epoch: int) -> None:
        self.members.set(members)
        self.epoch.set(epoch)

    def render(self, ready: int) -> bytes:
        self.workers_ready.set(ready)
        return generate_latest(self.registry)

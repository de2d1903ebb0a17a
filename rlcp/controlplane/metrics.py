"""Prometheus metrics of the controller, served on /metrics.

A registry per controller (tests run several in one process). Operation kinds and
phases are label values from `Literal`s, so the label sets stay small and fixed.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200)


class ControllerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.operation_duration = Histogram("rlcp_operation_duration_seconds", "Fleet operations by kind and status.",
                                            ["kind", "status"], buckets=_BUCKETS, registry=r)
        self.worker_failures = Counter("rlcp_worker_failures", "Failed worker calls by worker and phase.",
                                       ["worker", "phase"], registry=r)
        self.members = Gauge("rlcp_members", "Workers in the fleet.", registry=r)
        self.epoch = Gauge("rlcp_membership_epoch", "Membership epoch.", registry=r)
        self.workers_ready = Gauge("rlcp_workers_ready", "Workers ready at the desired state.", registry=r)
        self.desired_version = Info("rlcp_desired_weight", "Desired weight version.", registry=r)
        self.loop_lag = Histogram("rlcp_event_loop_lag_seconds", "How late the event loop woke a timer "
                                  "(rlcp/controlplane/loopwatch.py): what every request waits on top of its own work.",
                                  buckets=_LAG_BUCKETS, registry=r)

    def membership(self, members: int, epoch: int) -> None:
        self.members.set(members)
        self.epoch.set(epoch)

    def render(self, ready: int) -> bytes:
        self.workers_ready.set(ready)
        return generate_latest(self.registry)

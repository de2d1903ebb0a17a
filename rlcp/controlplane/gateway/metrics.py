"""Prometheus metrics of the gateway, on its own `/metrics` (its own registry: a controller
process and tests may hold several)."""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# The gateway's own time per request is sub-millisecond; the buckets resolve that.
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class WorkerMetrics(NamedTuple):
    routed: Counter
    in_flight: Gauge


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._workers: dict[str, WorkerMetrics] = {}
        self.in_flight = Gauge("rlcp_gateway_in_flight", "Requests being served, per worker.", ["worker"], registry=r)
        self.routed = Counter("rlcp_gateway_routed", "Requests sent to a worker.", ["worker"], registry=r)
        self.failed = Counter(
            "rlcp_gateway_worker_failures",
            "Workers that failed a request, by stage "
            "(before_first_byte: retried elsewhere; unreachable: the connection refused or failed, the "
            "worker ejected at once and the request sent elsewhere or held; mid_stream: ended with an error event).",
            ["worker", "stage"],
            registry=r,
        )
        self.ejected = Gauge(
            "rlcp_gateway_worker_ejected",
            "1 while a worker is out of the rotation after failing "
            "requests in a row (from its ejection until a probe succeeds), per worker.",
            ["worker"],
            registry=r,
        )
        self.ejections = Counter(
            "rlcp_gateway_worker_ejections",
            "Times a worker was ejected (outlier detection; at once for a refused connection or a dead "
            "engine), per worker.",
            ["worker"],
            registry=r,
        )
        self.held = Gauge("rlcp_gateway_held", "Requests waiting for a worker to serve.", registry=r)
        self.rejected = Counter("rlcp_gateway_rejected", "Requests answered 503, by reason.", ["reason"], registry=r)
        self.overhead = Histogram(
            "rlcp_gateway_added_seconds",
            "The gateway's own time before a request goes out (holding excluded).",
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )

    def worker(self, worker: str) -> WorkerMetrics:
        """The per-worker series a request moves, made once per worker: `labels()` per request
        was ~1.5% of the gateway's CPU."""
        children = self._workers.get(worker)
        if children is None:
            children = self._workers[worker] = WorkerMetrics(self.routed.labels(worker), self.in_flight.labels(worker))
        return children

    def render(self) -> bytes:
        return generate_latest(self.registry)

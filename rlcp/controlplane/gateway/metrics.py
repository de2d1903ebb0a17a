"""Prometheus metrics of the gateway, on its own `/metrics` (its own registry: a controller
process and tests may hold several).

The series a request moves (requests routed and in flight per worker, the gateway's own time per
request) are plain counts kept by the gateway and read only when `/metrics` is scraped
(`_PerRequest`): prometheus_client's children take a lock and a few calls per change, which was
~4% of the gateway's CPU per proxied request. The rest change only on failures and are its own.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample

# The gateway's own time per request is sub-millisecond; the buckets resolve that.
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class Overhead:
    """A histogram of the gateway's own time per request: a bucket count and a sum per
    observation, exposed as `rlcp_gateway_added_seconds` when scraped."""

    def __init__(self, bounds: tuple[float, ...] = _OVERHEAD_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1  # `le`: a value on a bound is in its bucket
        self.sum += seconds


class _PerRequest:
    """The collector of the per-request series, over the gateway's own counts."""

    def __init__(self, overhead: Overhead) -> None:
        self.in_flight: Mapping[str, int] = {}
        self.routed: Mapping[str, int] = {}
        self.overhead = overhead
        self._created: dict[str, float] = {}  # per worker: when it was first seen routed

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily("rlcp_gateway_in_flight", "Requests being served, per worker.", labels=["worker"])
        routed = CounterMetricFamily("rlcp_gateway_routed", "Requests sent to a worker.", labels=["worker"])
        for worker in sorted(self.routed):
            in_flight.add_metric([worker], self.in_flight.get(worker, 0))
            created = self._created.setdefault(worker, time.time())
            routed.add_metric([worker], self.routed[worker], created=created)
        yield in_flight
        yield routed

    def describe(self) -> Iterator[Metric]:
        yield from self.collect()


class _Added:
    """`rlcp_gateway_added_seconds`, as prometheus_client's own histogram writes it."""

    def __init__(self, overhead: Overhead) -> None:
        self.overhead = overhead

    def collect(self) -> Iterator[Metric]:
        o = self.overhead
        name = "rlcp_gateway_added_seconds"
        cumulative, buckets = 0, []
        for bound, count in zip((*o.bounds, float("inf")), o.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(cumulative)))
        family = HistogramMetricFamily(
            name,
            "The gateway's own time before a request goes out (holding excluded).",
            buckets=buckets,
            sum_value=o.sum,
        )
        family.samples.append(Sample(f"{name}_created", {}, o.created))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield from self.collect()


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.overhead = Overhead()
        self._per_request = _PerRequest(self.overhead)
        r.register(self._per_request)
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
        r.register(_Added(self.overhead))

    def count_requests(self, *, in_flight: Mapping[str, int], routed: Mapping[str, int]) -> None:
        """The gateway's own per-worker counts, exposed as `rlcp_gateway_in_flight` and
        `rlcp_gateway_routed_total`."""
        self._per_request.in_flight, self._per_request.routed = in_flight, routed

    def render(self) -> bytes:
        return generate_latest(self.registry)

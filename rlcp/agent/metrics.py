"""Prometheus metrics of one agent, on the admin port's /metrics.

A registry per agent, not the global one: fleet-scale tests run hundreds of agents
in one process, and each must count only its own operations.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rlcp.core.wire.agent.state import RequestCounts

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.operations = Counter(
            "rl_agent_operations", "Admin operations by kind and outcome.", ["kind", "status"], registry=self.registry
        )
        self.duration = Histogram(
            "rl_agent_operation_duration_seconds",
            "Admin operation duration.",
            ["kind"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._paused = Gauge("rl_agent_paused", "1 while generation is paused.", registry=self.registry)
        self._ready = Gauge("rl_agent_ready", "1 while the agent reports ready.", registry=self.registry)
        self._requests = Gauge("rl_agent_requests", "In-flight requests by state.", ["state"], registry=self.registry)

    def observe(self, kind: str, status: str, duration_s: float) -> None:
        self.operations.labels(kind, status).inc()
        self.duration.labels(kind).observe(duration_s)

    def render(self, *, paused: bool, ready: bool, requests: RequestCounts) -> bytes:
        """Refresh the gauges from the agent's view (the caller's), then render the text format."""
        self._paused.set(int(paused))
        self._ready.set(int(ready))
        for state, count in requests.model_dump().items():
            self._requests.labels(state).set(count)
        return generate_latest(self.registry)

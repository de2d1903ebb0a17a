"""The gateway as the controller's state document shows it (its `gateway` section, one per
fleet): the fence's versions, and per worker the gateway's own counts and its circuit. Built
when the document is, from what the proxy keeps; nothing here runs per request."""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from rlcp.controlplane.gateway.breaker import Breakers
from rlcp.controlplane.gateway.fleets import ModelRoutes
from rlcp.controlplane.gateway.routing import Router
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.wire.controller.state import GatewayView, GatewayWorkerView


class Counted(Protocol):
    """What a view reads of the gateway (`proxy.Gateway`)."""

    url: str | None
    settings: GatewaySettings
    fleets: ModelRoutes | None
    breakers: Breakers
    in_flight: Counter[str]
    routed: Counter[str]
    failed: Counter[str]
    held: int
    rejected: int


def gateway_view(gateway: Counted, router: Router) -> GatewayView:
    """The gateway as the fleet of `router` sees it."""
    table = router.table()
    state = router.state()
    inside = set(table.routes) if table else set()
    known = inside | set(gateway.routed) | set(gateway.in_flight)
    if gateway.fleets is not None:  # the counters are the gateway's; each fleet shows its own members'
        known &= inside | {w.id for w in (state.workers if state else [])}
    return GatewayView(
        url=gateway.url,
        allowed_versions=table.admitted if table else [],
        staleness_bound=state.desired.staleness_bound if state else 0,
        held=gateway.held,
        routed=sum(gateway.routed.values()),
        rejected=gateway.rejected,
        max_in_flight_per_worker=gateway.settings.max_in_flight_per_worker,
        workers=[worker_view(gateway, w, w in inside) for w in sorted(known)],
    )


def worker_view(gateway: Counted, worker: str, in_fence: bool) -> GatewayWorkerView:
    circuit = gateway.breakers.view(worker)
    return GatewayWorkerView(
        worker_id=worker,
        in_fence=in_fence,
        in_flight=gateway.in_flight[worker],
        routed=gateway.routed[worker],
        failed=gateway.failed[worker],
        circuit=circuit.state,
        consecutive_failures=circuit.consecutive_failures,
        ejections=circuit.ejections,
        back_in_s=None if circuit.back_in_s is None else round(circuit.back_in_s, 3),
    )

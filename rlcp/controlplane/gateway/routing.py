"""The routing table, and where the fleet state it is built from comes from.

`build_table` is pure: the fence over one `FleetState`, each member inside it a `Target` that
carries what a request to it needs (its URL, the version it was admitted at, and its flavor's
request path: pinned through a frontend, answers that name their version), worked out once per
table rather than asked of the control plane on each request. A `StateSource` hands out the state
with a generation that moves whenever it changed -- the controller in this process (its own
change counter), or a controller followed over HTTP (`follow.py`) -- and `Router` rebuilds
the table only when the generation moved, so a request costs a dictionary look-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rlcp.controlplane.gateway.fence import fence
from rlcp.controlplane.workerspec import request_path
from rlcp.core.wire.controller.state import FleetState, WorkerView
from rlcp.core.wire.versions import is_version_name


@dataclass(frozen=True)
class Target:
    """A member inside the fence, as a request reaches it."""

    worker_id: str
    url: str
    weight_version: str | None
    flavor: str = "agent"
    pinned: bool = False  # reached through its flavor's frontend, the body pinned to it (`pinning.py`)
    names_version: bool = False  # its answers name their weights' version, held to `weight_version`


@dataclass(frozen=True)
class RoutingTable:
    admitted: list[str]
    routes: dict[str, Target]  # worker id -> where to reach it, members inside the fence only
    why_empty: str  # said in a 503 when nothing serves
    members: tuple[str, ...] = ()  # the routes' worker ids, sorted: the balancer's candidates

    @property
    def desired(self) -> str | None:
        return self.admitted[0] if self.admitted else None


def build_table(state: FleetState, bound: int | None = None) -> RoutingTable:
    admitted, inside = fence(state, bound)
    routes = {w.id: target(w) for w in inside}
    return RoutingTable(
        admitted=admitted,
        routes=routes,
        why_empty="" if routes else _why(state, admitted),
        members=tuple(sorted(routes)),
    )


def target(view: WorkerView) -> Target:
    path = request_path(view.flavor)
    url = (view.inference_url or "").rstrip("/")
    return Target(view.id, url, view.weight_version, view.flavor, path.pinned, path.names_version)


def _why(state: FleetState, admitted: list[str]) -> str:
    if not state.workers:
        return "the fleet has no members"
    if state.phase in ("pausing", "paused", "updating", "verifying", "resuming"):
        return f"the fleet is {state.phase}"
    if state.pause_state == "paused":
        return "every member is paused"
    unnamed = [w.id for w in state.workers if w.weight_version is not None and not is_version_name(w.weight_version)]
    if unnamed and len(unnamed) == len(state.workers):
        return f"every member reports a weight version that is not a valid name ({', '.join(unnamed[:8])})"
    versions = ", ".join(repr(v) for v in admitted) or "any"
    return f"no member is reachable, serving and at an admitted weight version ({versions})"


class StateSource(Protocol):
    def current(self) -> tuple[int, FleetState] | None:
        """(generation, state), or None before the first state is known."""


class Router:
    """The table for the source's current state and a staleness bound, cached by generation."""

    def __init__(self, source: StateSource) -> None:
        self.source = source
        self._cache: dict[int | None, tuple[int, RoutingTable]] = {}
        self._members: tuple[int, dict[str, tuple[bool, str | None]]] | None = None
        self._served: tuple[int, frozenset[str]] | None = None

    def table(self, bound: int | None = None) -> RoutingTable | None:
        current = self.source.current()
        if current is None:
            return None
        generation, state = current
        cached = self._cache.get(bound)
        if cached is None or cached[0] != generation:
            if len(self._cache) > 64:  # per-request bounds are few; keep the cache small anyway
                self._cache.clear()
            cached = self._cache[bound] = (generation, build_table(state, bound))
        return cached[1]

    def member_now(self, worker_id: str) -> tuple[bool, str | None]:
        """(in service, weight version) the state names for a member now: in service is
        reachable, not paused and not cordoned (out of service for an update). (False, None)
        when unknown or gone."""
        current = self.source.current()
        if current is None:
            return False, None
        generation, state = current
        if self._members is None or self._members[0] != generation:
            self._members = (
                generation,
                {w.id: (w.reachable and w.paused is False and not w.cordoned, w.weight_version) for w in state.workers},
            )
        return self._members[1].get(worker_id, (False, None))

    def served(self) -> frozenset[str]:
        """The model names the state says this fleet serves (its `models`); empty before any state."""
        current = self.source.current()
        if current is None:
            return frozenset()
        generation, state = current
        if self._served is None or self._served[0] != generation:
            self._served = (generation, frozenset(state.models))
        return self._served[1]

    def state(self) -> FleetState | None:
        current = self.source.current()
        return None if current is None else current[1]

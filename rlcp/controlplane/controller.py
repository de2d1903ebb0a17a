"""One fleet's parts, built and held together (the process is assembled in `assembly.py`).

    registry     members and their observed state          fleet/members.py
    names        every fleet's model names (shared)         fleet/names.py
    desired      the only writer of the desired state      fleet/desired.py
    log          the running operation, its phase, history operations/record.py
    gate         one mutating operation at a time          operations/gate.py
    fanout       bounded concurrent calls, one per worker  workers/fanout.py
    transfer     the broadcast weight-transfer session     operations/broadcast.py
    reconciler   converges workers that are behind         reconcile/loop.py
    placement    the count of agents to place, last pass   placement/status.py (kind ray only)

`Controller` is the `OperationContext` operations are given (they see only that narrow
Protocol), and it answers the state document from `fleet/view.py`. It holds no loop of its
own: `supervisor.py` starts the background ones (discovery, status observer, reconciler,
Lease elector), and the API calls operations with it.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from rlcp.controlplane.deadlines import Deadlines
from rlcp.controlplane.discovery.base import DiscoverySource
from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.fleet.desired import DesiredKeeper
from rlcp.controlplane.fleet.members import FleetRegistry, WorkerRecord
from rlcp.controlplane.fleet.names import ModelNames
from rlcp.controlplane.fleet.observer import poll_statuses
from rlcp.controlplane.fleet.publish import FenceSync
from rlcp.controlplane.fleet.view import FleetFacts, StateCache, WorkerViews, build_state, worker_view
from rlcp.controlplane.fleetnames import DEFAULT_FLEET
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.metrics import ControllerMetrics
from rlcp.controlplane.operations.broadcast import WeightTransfer
from rlcp.controlplane.operations.context import Detached
from rlcp.controlplane.operations.gate import OperationGate
from rlcp.controlplane.operations.record import OperationLog
from rlcp.controlplane.persistence.base import DesiredStore
from rlcp.controlplane.placement.status import PlacementStatus
from rlcp.controlplane.reconcile.loop import Reconciler
from rlcp.controlplane.reconcile.ratelimit import WorkerRateLimiter
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.settings.fleets import FleetSettings
from rlcp.controlplane.workers.capabilities import Driver
from rlcp.controlplane.workers.fanout import FanOut
from rlcp.controlplane.workers.registry import make_driver
from rlcp.controlplane.workers.transport import CallPolicy, HttpTransport, WorkerTransport
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.cached import CachedBody
from rlcp.core.wire.controller.state import EnvoyPlaneView, FleetState, GatewayView, WorkerView

TransportFactory = Callable[[WorkerSpec, CallPolicy], WorkerTransport]


def http_transports(session: aiohttp.ClientSession, token: str | None) -> TransportFactory:
    """Workers reached over HTTP on the process's one client session."""

    def make(spec: WorkerSpec, policy: CallPolicy) -> WorkerTransport:
        return HttpTransport(session=session, worker_id=spec.id, base_url=spec.admin_url, token=token, policy=policy)

    return make


class Controller:
    def __init__(
        self,
        settings: ControllerSettings,
        *,
        transports: TransportFactory,
        store: DesiredStore,
        leadership: Leadership | None = None,
        fleet: str = DEFAULT_FLEET,
        names: ModelNames | None = None,
    ) -> None:
        """`fleet`: which of the settings' fleets this controller keeps (`fleets.py`); the
        default one is every member no named fleet's selector matches. `names`: the model names
        of every fleet of this process, shared by their controllers (this fleet joins it)."""
        self.settings = settings
        self.fleet = fleet
        self.fleet_settings: FleetSettings | None = settings.fleets.get(fleet)
        self.allowed_roots = list(settings.allowed_roots)
        self.deadlines = Deadlines.from_settings(settings)
        # Without leader election this replica always leads: the single-controller behaviour.
        self.leadership = leadership or Leadership.always(settings.controller_id)
        self.metrics = ControllerMetrics()
        self.changes = ChangeCounter()
        w = settings.workers
        self._policy = CallPolicy(timeout_s=w.timeout_s, attempts=w.attempts, retry_budget_s=w.retry_budget_s)
        self._transports = transports
        self.registry = FleetRegistry(make_driver=self._make_driver, changes=self.changes)
        self.names = names or ModelNames()
        self.names.add_fleet(fleet, self.served_names)
        self.desired = DesiredKeeper(
            store=store,
            changes=self.changes,
            on_saved=lambda d: self.metrics.desired_version.info({"version": d.weight_version or ""}),
        )
        self.gate = OperationGate(wait_for_reconciler_s=settings.reconcile.yield_timeout_s)
        self.fanout = FanOut(w.max_concurrency)
        self.log = OperationLog(changes=self.changes, metrics=self.metrics)
        self.detached = Detached()  # operations whose callers did not wait
        self.transfer = WeightTransfer(
            self, settings=settings.weight_transfer, changes=self.changes, is_leader=lambda: self.leadership.is_leader
        )
        self.reconciler = self._make_reconciler()
        self._views = WorkerViews()
        self._state = StateCache(self.changes, lambda: self.state(), self._views.json)  # late-bound: tests count builds
        # The inference gateway in this process, if one runs (`gateway/local.py` sets it): its
        # section of the state document. Its counters move per request, so they are read when
        # the document is rebuilt (every status poll at least), not on each request.
        self.gateway_view: Callable[[], GatewayView] | None = None
        # Envoy as the data plane (`gateway/envoy/`): operations wait for its ACK of a narrowed
        # fence before pausing (`fleet/publish.py`); its section of the state document.
        self.fence_sync: FenceSync | None = None
        self.envoy_view: Callable[[], EnvoyPlaneView] | None = None
        self._base: tuple[int, FleetState] | None = None
        self.placement = self._placement_status()

    def _make_reconciler(self) -> Reconciler:
        r = self.settings.reconcile
        return Reconciler(
            registry=self.registry,
            desired=self.desired,
            gate=self.gate,
            fanout=self.fanout,
            deadlines=self.deadlines,
            leadership=self.leadership,
            limiter=WorkerRateLimiter(initial_s=r.backoff_initial_s, max_s=r.backoff_max_s),
            metrics=self.metrics,
            refresh=self.refresh,
            ensure_leading=self.ensure_leading,
        )

    def _placement_status(self) -> PlacementStatus | None:
        """Placement's count and last pass (placement.kind ray); its loop is started by the supervisor.
        The default fleet's: the agents it places join whichever fleet their labels select."""
        placement = self.settings.placement
        ray = placement.ray if placement.kind == "ray" and self.fleet == DEFAULT_FLEET else None
        return None if ray is None else PlacementStatus(ray, desired=lambda: self.desired.state.placement_replicas)

    def _make_driver(self, spec: WorkerSpec) -> Driver:
        return make_driver(spec, self._transports(spec, self._policy), self.deadlines.driver)

    # -- membership and observation --------------------------------------------------------
    def apply_membership(self, specs: list[WorkerSpec]) -> None:
        if self.registry.apply(specs) is not None:
            self.metrics.membership(len(self.registry.members()), self.registry.membership.epoch)

    async def follow_discovery(self, source: DiscoverySource) -> None:
        async for specs in source.watch():
            self.apply_membership(specs)

    def members(self) -> list[WorkerRecord]:
        return self.registry.members()

    async def refresh(self, records: list[WorkerRecord] | None = None) -> None:
        """Read these workers' statuses now (default: every member)."""
        await poll_statuses(self.registry, self.fanout, deadline_s=self.deadlines.control_s, records=records)

    # -- leadership ---------------------------------------------------------------------------
    async def load_desired(self) -> None:
        await self.desired.load(term=self.leadership.term)
        if self.leadership.is_leader:
            await self.recover_operations()

    async def recover_operations(self) -> None:
        """The operations the desired state kept, into the log; one kept as running was
        interrupted (whoever ran it stopped, or stopped leading), and is kept so from now on."""
        kept = await self.desired.interrupt_operations(
            f"still running when controller {self.settings.controller_id!r} "
            f"(replica {self.leadership.identity!r}) began to lead the "
            "fleet: the replica that ran it stopped or stopped leading"
        )
        self.log.restore(kept)

    async def ensure_leading(self) -> None:
        """Refuse (409 `not_leader`, naming the leader) unless this replica leads. The first
        time in a new term, reload the desired state: the previous leader may have changed it,
        and may have driven the workers, so a broadcast group of ours is forgotten."""
        self.leadership.require()
        if await self.desired.reload_for_term(self.leadership.term):
            self.transfer.forget("a new leadership term began")
            await self.recover_operations()
        self.leadership.require()  # leadership may have gone while the store answered

    # -- state ------------------------------------------------------------------------------------
    def worker_view(self, rec: WorkerRecord) -> WorkerView:
        return worker_view(self.desired.state, rec)

    def facts(self) -> FleetFacts:
        membership = self.registry.membership
        desired, members = self.desired.state, self.registry.members()
        operation = self.log.running_or_last()
        return FleetFacts(
            fleet=self.fleet,
            models=self.served_names(),
            desired=desired,
            members=members,
            views=self._views.views(desired, members),
            membership_epoch=membership.epoch,
            discovery_synced=membership.synced,
            phase=self.log.phase,
            operation=operation,
            update=self.log.update_view(operation),
            verified=self.log.verified,
            transfer=self.transfer.view(),
        )

    def base_state(self) -> FleetState:
        """The state document without the gateway's section, built once per change: the
        document served and the gateway's routing table are both made from it."""
        generation = self.changes.generation
        if self._base is None or self._base[0] != generation:
            self._base = (generation, build_state(self.facts()))
        return self._base[1]

    def served_names(self) -> list[str]:
        """The model names the gateway routes to this fleet: its settings' `models`, the base
        models its members serve (as discovery named them, or as they report) and the adapters
        it keeps or they have loaded. Part of the state's facts, so built once per change."""
        names = set(self.fleet_settings.models if self.fleet_settings else ())
        names.update(self.desired.state.loras)
        for rec in self.registry.members():
            names.update(n for n in (rec.spec.model, rec.status.model if rec.status else None) if n)
            names.update(rec.status.loras if rec.status else ())
        return sorted(names)

    def state(self) -> FleetState:
        base = self.base_state()
        sections: dict[str, object] = {}
        if self.gateway_view is not None:
            sections["gateway"] = self.gateway_view()
        if self.envoy_view is not None:
            sections["envoy"] = self.envoy_view()
        return base.model_copy(update=sections) if sections else base

    def state_json(self) -> bytes:
        """`state()` serialized, rebuilt only when something it shows has changed."""
        return self._state.json()

    def state_body(self) -> CachedBody:
        """`state_json()` with its entity tag and its gzip copy (made once per change)."""
        return self._state.body()

    def state_etag(self) -> str:
        """The entity tag `state_body()` would carry now; builds nothing."""
        return self._state.etag()

"""One inference request through the gateway, as a short loop: choose a member, try it, apply
the verdict.

- **Choose.** The balancing policy (`balancing/`) picks among the members inside the fence
  that are neither at their admission limit nor ejected by outlier detection (`admission.py`,
  `breaker.py`), leaving out those this request already tried. While there is none (a pause, an
  update, a fleet not yet converged, every member ejected), the request is held, bounded in
  count (`max_held`) and time (the hold deadline, from settings or `X-RL-Hold-Timeout`), and
  goes out as soon as a member serves again; past the deadline it is answered 503 with
  `Retry-After` and a JSON error saying why.
- **Try.** `send.py`: the request to that member, its answer handed on (a stream as it comes).
- **Verdict.** A try that ended before the first byte says why (`retry.py`'s table: whether
  the request goes elsewhere, whether that counts toward `attempts`, what it says of the
  worker's circuit); the answer's status, or a stream broken mid-way, otherwise. A client that
  goes away cancels the handler (the site runs with handler cancellation), which closes the
  upstream request and gives no verdict.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import structlog
from aiohttp import web

from rlcp.controlplane.gateway.admission import unavailable, why_unavailable
from rlcp.controlplane.gateway.balancing.factory import make_policy
from rlcp.controlplane.gateway.breaker import Breakers, CircuitState
from rlcp.controlplane.gateway.errors import EngineDied, NoCapacity, UpstreamFailed
from rlcp.controlplane.gateway.fleets import ModelRoutes
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.retry import RULES, RetryReason, TryFailed, refusals
from rlcp.controlplane.gateway.routing import Router, RoutingTable, Target
from rlcp.controlplane.gateway.send import Sender
from rlcp.controlplane.gateway.views import gateway_view
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.wire.controller.state import GatewayView

log = structlog.get_logger("rlcp.controlplane.gateway")

_POLL_S = 0.02  # how often a held request looks at the table again
_RETRY_PAUSE_S = 0.1  # before trying members that failed this request once already


@dataclass(frozen=True, kw_only=True)
class RequestPolicy:
    """Per request: the staleness bound (None: the desired state's), the hold deadline, the
    session key, and the fleet's router (None: the gateway's own; `fleets.py` picks by model)."""

    bound: int | None
    hold_s: float
    session: str | None
    router: Router | None = None


@dataclass
class _Tries:
    """One request's record across its tries."""

    deadline: float  # its hold deadline (monotonic)
    tried: set[str] = field(default_factory=set)  # not to be chosen again (until all were)
    failures: list[str] = field(default_factory=list)  # the tries counted toward `attempts`, said in a 502
    refused: dict[str, str] = field(default_factory=dict)  # members that could not be connected to, said in a 503


class Gateway:
    def __init__(
        self,
        *,
        router: Router,
        session: aiohttp.ClientSession,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        admin_token: str | None = None,
        fleets: ModelRoutes | None = None,
    ) -> None:
        """`session`: for what the gateway asks the members itself (their models); inference goes
        over the sender's own pool (`upstream.py`). `admin_token`: the controller's (the one it
        runs in, or follows), which inference accepts too with `settings.accept_admin_token`.
        `fleets`: several fleets, each with its router (`router` is the default fleet's), chosen
        per request by model."""
        self.router, self.session, self.settings, self.metrics = router, session, settings, metrics
        self.fleets = fleets
        self.admin_token = admin_token
        self.url: str | None = None  # where the site bound, once it has
        self.in_flight: Counter[str] = Counter()
        self.routed: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.held = 0
        self.rejected = 0
        metrics.count_requests(in_flight=self.in_flight, routed=self.routed)
        self.balancer = make_policy(settings)
        # Called when a worker is ejected or restored: the controller this gateway runs in shows it in
        # its state document at once (its gateway section is otherwise refreshed with each status poll).
        self.on_circuit_change: Callable[[], None] | None = None
        self.breakers = Breakers(
            failures=settings.outlier_failures,
            backoff_s=settings.outlier_backoff_s,
            max_backoff_s=settings.outlier_max_backoff_s,
            on_change=self._circuit_changed,
        )
        # Resolved once, not per request (with `token_file` that would be a file read on the hot path).
        own_tokens = tuple(t for t in (settings.resolved_token(), admin_token) if t)
        self.sender = Sender(
            settings=settings,
            metrics=metrics,
            own_tokens=own_tokens,
            in_flight=self.in_flight,
            routed=self.routed,
            failed=self.failed,
        )

    def close(self) -> None:
        """Close the idle connections to the workers (the site's cleanup)."""
        self.sender.upstream.close()

    def accepted_admin_tokens(self) -> tuple[str, ...]:
        """Tokens inference accepts besides the gateway's own."""
        return (self.admin_token,) if self.admin_token and self.settings.accept_admin_token else ()

    def router_for(self, model: str | None) -> Router:
        return self.router if self.fleets is None else self.fleets.router_for(model)

    def view(self, router: Router | None = None) -> GatewayView:
        """The gateway as one fleet sees it (`router`: that fleet's; default the gateway's own)."""
        return gateway_view(self, router or self.router)

    def _circuit_changed(self, worker: str, state: CircuitState, backoff_s: float | None) -> None:
        if state == "open":
            self.metrics.ejected.labels(worker).set(1)
            self.metrics.ejections.labels(worker).inc()
            log.warning(
                "gateway_worker_ejected",
                worker_id=worker,
                backoff_s=backoff_s,
                failures=self.breakers.view(worker).consecutive_failures,
            )
        else:
            self.metrics.ejected.labels(worker).set(0)
            log.info("gateway_worker_restored", worker_id=worker)
        if self.on_circuit_change is not None:
            self.on_circuit_change()

    # -- one request ----------------------------------------------------------------------------
    async def forward(self, request: web.Request, body: bytes, policy: RequestPolicy) -> web.StreamResponse:
        arrived = time.perf_counter()
        router = policy.router or self.router
        tries = _Tries(deadline=time.monotonic() + policy.hold_s)
        while True:
            route, held_s = await self._choose(router, policy, tries)
            self.metrics.overhead.observe(max(0.0, time.perf_counter() - arrived - held_s))
            worker = route.worker_id
            tries.tried.add(worker)
            probe = self.breakers.sent(worker)
            try:
                response, served = await self.sender.send(request, body, route, router)
            except TryFailed as failure:
                self.breakers.record(worker, RULES[failure.reason].breaker, probe=probe)
                await self._after(failure, route, router, policy, tries)
                continue
            except BaseException:  # the client went away: no verdict, and the next request may probe
                self.breakers.record(worker, "none", probe=probe)
                raise
            self.breakers.record(worker, "succeeded" if served else "failed", probe=probe)
            return response

    async def _after(
        self, failure: TryFailed, route: Target, router: Router, policy: RequestPolicy, tries: _Tries
    ) -> None:
        """A try that ended before the first byte, by `retry.RULES`: returns to try again, or
        raises the client's answer."""
        rule, worker, why = RULES[failure.reason], route.worker_id, str(failure)
        if rule.stage is not None:
            self.failed[worker] += 1
            self.metrics.failed.labels(worker, rule.stage).inc()
        if not rule.resent:
            log.error("gateway_engine_died", worker_id=worker, status=failure.status, error=why)
            raise EngineDied(
                f"worker {worker}'s engine died while serving this request (HTTP {failure.status}: {why}); it was "
                "not sent to another worker, since it may be what killed the engine"
            ) from None
        if not rule.counts_as_try:
            tries.tried.discard(worker)  # back as a candidate (an unreachable one once its backoff is up)
            if failure.reason is RetryReason.UNREACHABLE:
                tries.refused[worker] = why
                log.warning("gateway_worker_unreachable", worker_id=worker, error=why)
                return
            # Not the member's failure: an update took it out of service meanwhile. The request
            # goes again, to whatever is in service, within its hold deadline.
            log.info("gateway_answer_dropped", worker_id=worker, reason=why)
            if time.monotonic() >= tries.deadline:
                self._reject("deadline")
                raise NoCapacity(
                    f"no answer within {policy.hold_s:g}s from a member still in service: {why}", retry_after_s=1
                ) from None
            return
        tries.failures.append(f"{worker}: {why}")
        retrying = len(tries.failures) < self.settings.attempts
        log.warning("gateway_worker_failed", worker_id=worker, error=why, retrying=retrying)
        if not retrying:
            raise UpstreamFailed(
                f"{len(tries.failures)} tries failed before an answer: {'; '.join(tries.failures)}"
                f"{refusals(tries.refused)}"
            ) from None
        table = router.table(policy.bound)
        if table is None or tries.tried >= table.routes.keys():
            # Every member was tried: try them again in a moment. A reused connection the
            # worker had just closed fails once; a refused one may have left the view by then.
            tries.tried.clear()
            await asyncio.sleep(_RETRY_PAUSE_S)

    async def _choose(self, router: Router, policy: RequestPolicy, tries: _Tries) -> tuple[Target, float]:
        """A route inside the fence and not yet tried, holding the request while there is none;
        and how long it was held."""
        held_since: float | None = None
        try:
            while True:
                table = router.table(policy.bound)
                if table is not None:
                    blocked = unavailable(
                        table.members,
                        in_flight=self.in_flight,
                        limit=self.settings.max_in_flight_per_worker,
                        breakers=self.breakers,
                    )
                    exclude = blocked | tries.tried if tries.tried else blocked
                    worker = self.balancer.pick(table.members, self.in_flight, key=policy.session, exclude=exclude)
                    if worker is not None:
                        return table.routes[worker], (time.monotonic() - held_since if held_since else 0.0)
                if time.monotonic() >= tries.deadline:
                    self._reject("deadline")
                    raise NoCapacity(
                        f"no worker could serve within {policy.hold_s:g}s: {self._why_none(table)}"
                        f"{refusals(tries.refused)}",
                        retry_after_s=max(1, math.ceil(min(policy.hold_s, 30.0))),
                    )
                if held_since is None:
                    if self.held >= self.settings.max_held:
                        self._reject("queue_full")
                        raise NoCapacity(
                            f"{self.held} requests are already waiting (gateway.max_held): {self._why_none(table)}"
                            f"{refusals(tries.refused)}",
                            retry_after_s=1,
                        )
                    held_since = time.monotonic()
                    self.held += 1
                    self.metrics.held.inc()
                await asyncio.sleep(min(_POLL_S, max(0.0, tries.deadline - time.monotonic())))
        finally:
            if held_since is not None:
                self.held -= 1
                self.metrics.held.dec()

    def _why_none(self, table: RoutingTable | None) -> str:
        """Why no member may take a request: said only when it is refused, not on each look of a held one."""
        if table is None:
            return "the gateway has no fleet state yet"
        return table.why_empty or why_unavailable(
            table.routes, in_flight=self.in_flight, limit=self.settings.max_in_flight_per_worker, breakers=self.breakers
        )

    def _reject(self, reason: str) -> None:
        self.rejected += 1
        self.metrics.rejected.labels(reason).inc()

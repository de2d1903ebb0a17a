"""One inference request through the gateway: hold, choose, forward, answer.

- **Hold.** While nothing inside the fence can serve (a pause, an update, a fleet not yet
  converged), the request waits, bounded in count (`max_held`) and time (the hold
  deadline, from settings or `X-RL-Hold-Timeout`), and goes out as soon as a member serves
  again; past the deadline it is answered 503 with `Retry-After` and a JSON error saying why.
- **Choose.** `balance.order`: least outstanding, or the session's worker, among the members
  inside the fence that are neither at their admission limit nor ejected by outlier detection
  (`admission.py`, `breaker.py`); when every member is one or the other, the request is held
  as above.
- **Forward.** The worker's status, headers and body come back unchanged, plus `X-RL-Worker`
  and `X-RL-Weight-Version` (the version the fence saw it at) and, when the engine reports
  them, `X-RL-Weight-Versions`: which weights sampled which tokens, one list of spans per
  choice (an agent sends the header itself; vLLM's tokens-in/tokens-out answers carry the
  spans in the body). A keep-mode request resumed after an update shows it there.
  A member of a flavor without an inference port of its own (Dynamo) is reached through its
  frontend with the request pinned to it (`pinning.py`); a frontend that refuses the pin is
  that member's failure, like a broken connection, never an unpinned answer. Such a member
  cannot refuse a request sent for other weights either (an agent answers 409), and a request
  that reached its engine's queue but not its batch when it paused runs after the resume, on
  the new weights (vLLM's wait-mode pause drains only what runs; seen in
  tests/e2e/test_dynamo_rollouts.py, answered ~20 ms after the resume, before the controller
  had read the new version). So an answer from a pinned member is handed on only if the member
  is still in service (not cordoned, not paused) at the version it was sent at; otherwise the
  request is served again by a member in service (a stream ends with an SSE error event
  instead, its bytes gone out). The cost: answers a member finishes while an update takes it
  out of service are computed twice.
  A worker that fails before the first byte reaches the client is skipped and the request
  tried on the next, at most `attempts` tries in all (then 502 `upstream_failed`); one that
  fails mid-stream ends the stream with an SSE error event.
  A worker that cannot be connected to at all (the connect refused: nothing listening; or no
  route, no such host) is down, not failing: the request never reached it, so the try is not
  counted toward `attempts`, the worker is ejected at once (a burst refused together is one
  ejection: `breaker.py`), and the request goes to another member or is held as above, until
  one serves (the worker restarted, once its backoff lets a probe through) or its hold deadline
  passes: 503 `no_capacity` with `Retry-After`, naming the members that refused. Without this a
  fleet whose one worker died answered 502 within two retry pauses (~0.2 s), before the
  controller had even noticed. It cannot loop: an ejected worker is not chosen again until its
  backoff is up, each refused probe doubles it. A connect *timeout* is not counted so (a
  listening worker whose backlog is full times out too): it is an ordinary failed try.
  An engine's death ejects its worker at once (not after `outlier_failures`): a request that
  arrives at a dead engine (an agent's 503 `engine_dead`) never reached it and goes to the
  next worker; a request **during which** the engine died (a 5xx with `X-RL-Engine-Died`, or
  vLLM's own dead-engine message from a stock server) is not sent again, since it may be what
  killed the engine and would kill the next: its client gets a 502 `engine_died` naming the
  worker. A
  client that goes away cancels the handler (the site runs with handler cancellation), which
  closes the upstream request.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict

from rlcp.controlplane.gateway.admission import unavailable, why_unavailable
from rlcp.controlplane.gateway.balance import order
from rlcp.controlplane.gateway.breaker import Breakers, CircuitState
from rlcp.controlplane.gateway.fleets import ModelRoutes
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.pinning import names_version, pin_refused, pinned_body, pins
from rlcp.controlplane.gateway.routing import Router, RoutingTable, Target
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.errors import ApiError
from rlcp.core.http import HOP_BY_HOP, presents_one_of
from rlcp.core.tracing import REQUEST_ID_HEADER, TRACEPARENT_HEADER, outgoing_headers
from rlcp.core.wire.agent.inference import (
    ENGINE_DEAD,
    ENGINE_DIED_HEADER,
    EXPECT_VERSION_HEADER,
    VERSION_MISMATCH,
    WEIGHT_VERSIONS_HEADER,
)
from rlcp.core.wire.controller.state import GatewayView, GatewayWorkerView

log = structlog.get_logger("rlcp.controlplane.gateway")

_POLL_S = 0.02  # how often a held request looks at the table again
_RETRY_PAUSE_S = 0.1  # before trying members that failed this request once already


class NoCapacity(ApiError):
    """503: nothing could serve within the hold deadline (or the hold queue is full)."""

    status = 503
    code = "no_capacity"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class UpstreamFailed(ApiError):
    """502: every worker tried failed before answering."""

    status = 502
    code = "upstream_failed"


class EngineDied(ApiError):
    """502: the worker's engine died while serving this request (not resent: see the module doc)."""

    status = 502
    code = "engine_died"


@dataclass(frozen=True, kw_only=True)
class RequestPolicy:
    """Per request: the staleness bound (None: the desired state's), the hold deadline, the
    session key, and the fleet's router (None: the gateway's own; `fleets.py` picks by model)."""

    bound: int | None
    hold_s: float
    session: str | None
    router: Router | None = None


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
        """`admin_token`: the controller's (the one it runs in, or follows), which inference
        accepts too with `settings.accept_admin_token`. `fleets`: several fleets, each with its
        router (`router` is the default fleet's), chosen per request by model."""
        self.router, self.session, self.settings, self.metrics = router, session, settings, metrics
        self.fleets = fleets
        self.admin_token = admin_token
        self.url: str | None = None  # where the site bound, once it has
        self.in_flight: Counter[str] = Counter()
        self.routed: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.held = 0
        self.rejected = 0
        self._turn = 0  # rotates ties between equally loaded workers
        # Called when a worker is ejected or restored: the controller this gateway runs in shows it in
        # its state document at once (its gateway section is otherwise refreshed with each status poll).
        self.on_circuit_change: Callable[[], None] | None = None
        self.breakers = Breakers(
            failures=settings.outlier_failures,
            backoff_s=settings.outlier_backoff_s,
            max_backoff_s=settings.outlier_max_backoff_s,
            on_change=self._circuit_changed,
        )
        # The gateway's tokens (its own, the controller's) are not the workers' to see; any other
        # Authorization (a key a worker itself checks) passes. Resolved once, not per request
        # (with `token_file` that would be a file read on the hot path).
        # The request id and trace go on as this call's (`rlcp.core.tracing`): a new span per try.
        self._drop_upstream = HOP_BY_HOP | {
            EXPECT_VERSION_HEADER.lower(),
            REQUEST_ID_HEADER.lower(),
            TRACEPARENT_HEADER.lower(),
        }
        self._timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s, sock_connect=settings.connect_timeout_s)
        self._own_tokens = tuple(t for t in (settings.resolved_token(), admin_token) if t)

    def accepted_admin_tokens(self) -> tuple[str, ...]:
        """Tokens inference accepts besides the gateway's own."""
        return (self.admin_token,) if self.admin_token and self.settings.accept_admin_token else ()

    # -- state ------------------------------------------------------------------------------
    def router_for(self, model: str | None) -> Router:
        return self.router if self.fleets is None else self.fleets.router_for(model)

    def view(self, router: Router | None = None) -> GatewayView:
        """The gateway as one fleet sees it (`router`: that fleet's; default the gateway's own)."""
        router = router or self.router
        table = router.table()
        state = router.state()
        inside = set(table.routes) if table else set()
        known = inside | set(self.routed) | set(self.in_flight)
        if self.fleets is not None:  # the counters are the gateway's; each fleet shows its own members'
            known &= inside | {w.id for w in (state.workers if state else [])}
        return GatewayView(
            url=self.url,
            allowed_versions=table.admitted if table else [],
            staleness_bound=state.desired.staleness_bound if state else 0,
            held=self.held,
            routed=sum(self.routed.values()),
            rejected=self.rejected,
            max_in_flight_per_worker=self.settings.max_in_flight_per_worker,
            workers=[self._worker_view(w, w in inside) for w in sorted(known)],
        )

    def _worker_view(self, worker: str, in_fence: bool) -> GatewayWorkerView:
        circuit = self.breakers.view(worker)
        return GatewayWorkerView(
            worker_id=worker,
            in_fence=in_fence,
            in_flight=self.in_flight[worker],
            routed=self.routed[worker],
            failed=self.failed[worker],
            circuit=circuit.state,
            consecutive_failures=circuit.consecutive_failures,
            ejections=circuit.ejections,
            back_in_s=None if circuit.back_in_s is None else round(circuit.back_in_s, 3),
        )

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
        deadline = time.monotonic() + policy.hold_s
        tried: set[str] = set()
        failures: list[str] = []
        refused: dict[str, str] = {}  # worker -> why it could not be connected to (not counted as tries)
        while True:
            route, held_s = await self._choose(router, policy, deadline, frozenset(tried), refused)
            tried.add(route.worker_id)
            self.metrics.overhead.observe(max(0.0, time.perf_counter() - arrived - held_s))
            probe = self.breakers.sent(route.worker_id)
            verdict: bool | None = None  # the try's outcome for outlier detection; None: no verdict
            try:
                response = await self._send(request, body, route, router)
                verdict = response.status < 500 and not response.get(_BROKEN, False)
                return response
            except _EngineDied as exc:
                self.breakers.eject(route.worker_id)  # the verdict, given at once (None: not counted again)
                self.failed[route.worker_id] += 1
                self.metrics.failed.labels(route.worker_id, "engine_died").inc()
                log.error("gateway_engine_died", worker_id=route.worker_id, status=exc.status, error=str(exc))
                raise EngineDied(
                    f"worker {route.worker_id}'s engine died while serving this request (HTTP "
                    f"{exc.status}: {exc}); it was not sent to another worker, since it may be what "
                    "killed the engine"
                ) from None
            except _BeforeFirstByte as exc:
                if exc.reason is RetryReason.ANSWER_AGAIN:
                    # Not the member's failure: an update took it out of service meanwhile. The
                    # request goes again, to whatever is in service, within its hold deadline.
                    log.info("gateway_answer_dropped", worker_id=route.worker_id, reason=str(exc))
                    tried.discard(route.worker_id)
                    if time.monotonic() >= deadline:
                        self._reject("deadline")
                        raise NoCapacity(
                            f"no answer within {policy.hold_s:g}s from a member still in service: {exc}",
                            retry_after_s=1,
                        ) from None
                    continue
                if exc.reason is RetryReason.UNREACHABLE:
                    # Down, not failing (see the module doc): ejected (so `_choose` holds the request
                    # while every member is out), not a try; the verdict given here, not in `finally`.
                    self.breakers.unreachable(route.worker_id, probe=probe)
                    tried.discard(route.worker_id)  # back as a probe once its backoff is up
                    refused[route.worker_id] = str(exc)
                    self.failed[route.worker_id] += 1
                    self.metrics.failed.labels(route.worker_id, "unreachable").inc()
                    log.warning("gateway_worker_unreachable", worker_id=route.worker_id, error=str(exc))
                    continue
                if exc.reason is RetryReason.ENGINE_DEAD:
                    self.breakers.eject(route.worker_id)  # the verdict, given at once
                verdict = False if exc.reason is RetryReason.FAILED else None
                self.failed[route.worker_id] += 1
                self.metrics.failed.labels(route.worker_id, "before_first_byte").inc()
                failures.append(f"{route.worker_id}: {exc}")
                retrying = len(failures) < self.settings.attempts
                log.warning("gateway_worker_failed", worker_id=route.worker_id, error=str(exc), retrying=retrying)
                if not retrying:
                    raise UpstreamFailed(
                        f"{len(failures)} tries failed before an answer: {'; '.join(failures)}{_refusals(refused)}"
                    ) from None
                table = router.table(policy.bound)
                if table is None or tried >= table.routes.keys():
                    # Every member was tried: try them again in a moment. A reused connection the
                    # worker had just closed fails once; a refused one may have left the view by then.
                    tried.clear()
                    await asyncio.sleep(_RETRY_PAUSE_S)
            finally:
                if verdict is None:
                    self.breakers.released(route.worker_id, probe=probe)
                elif verdict:
                    self.breakers.succeeded(route.worker_id, probe=probe)
                else:
                    self.breakers.failed(route.worker_id, probe=probe)

    async def _choose(
        self,
        router: Router,
        policy: RequestPolicy,
        deadline: float,
        tried: frozenset[str],
        refused: dict[str, str],
    ) -> tuple[Target, float]:
        """A route inside the fence and not yet tried, holding the request while there is none
        (`refused`: the members that could not be connected to for it, said in its 503)."""
        held_since: float | None = None
        try:
            while True:
                table = router.table(policy.bound)
                if table is not None:
                    self._turn += 1
                    blocked = unavailable(
                        table.routes,
                        in_flight=self.in_flight,
                        limit=self.settings.max_in_flight_per_worker,
                        breakers=self.breakers,
                    )
                    candidates = order(
                        sorted(table.routes),
                        self.in_flight,
                        session=policy.session,
                        exclude=tried | blocked,
                        turn=self._turn,
                        load_factor=self.settings.affinity_load_factor,
                    )
                    if candidates:
                        return table.routes[candidates[0]], (time.monotonic() - held_since if held_since else 0.0)
                if time.monotonic() >= deadline:
                    self._reject("deadline")
                    raise NoCapacity(
                        f"no worker could serve within {policy.hold_s:g}s: {self._why_none(table)}{_refusals(refused)}",
                        retry_after_s=max(1, math.ceil(min(policy.hold_s, 30.0))),
                    )
                if held_since is None:
                    if self.held >= self.settings.max_held:
                        self._reject("queue_full")
                        raise NoCapacity(
                            f"{self.held} requests are already waiting (gateway.max_held): {self._why_none(table)}"
                            f"{_refusals(refused)}",
                            retry_after_s=1,
                        )
                    held_since = time.monotonic()
                    self.held += 1
                    self.metrics.held.inc()
                await asyncio.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))
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

    async def _send(self, request: web.Request, body: bytes, route: Target, router: Router) -> web.StreamResponse:
        worker = route.worker_id
        self.in_flight[worker] += 1
        self.routed[worker] += 1
        series = self.metrics.worker(worker)
        series.routed.inc()
        series.in_flight.inc()
        try:
            timeout = self._timeout
            pinned = pins(route.flavor)
            # A member whose answers name the weights that made them (SGLang) is held to the
            # fence's version by its answer; a pinned one by the state after it answered.
            named = names_version(route.flavor)
            if pinned:
                try:
                    body = pinned_body(body, worker)
                except ValueError as exc:
                    raise _BeforeFirstByte(str(exc)) from exc
            try:
                upstream = await self.session.request(
                    request.method,
                    route.url + request.rel_url.path_qs,
                    data=body or None,
                    headers=self._upstream_headers(request, route),
                    timeout=timeout,
                    allow_redirects=False,
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise _BeforeFirstByte(*_connect_failure(exc)) from exc
            async with upstream:
                if upstream.status == 409 and (refusal := await _version_refusal(upstream)) is not None:
                    # An agent whose weights are no longer the ones the fence saw (it restarted,
                    # or changed them since the controller last read it): another worker serves.
                    raise _BeforeFirstByte(refusal, RetryReason.VERSION_REFUSED)
                headers = self._client_headers(upstream.headers, route)
                if upstream.content_type == "text/event-stream":
                    return await self._stream(request, upstream, headers, route if pinned or named else None, router)
                try:
                    payload = await upstream.read()
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    raise _BeforeFirstByte(f"the answer broke off: {type(exc).__name__}: {exc}") from exc
                if upstream.status >= 500 and (death := _engine_death(upstream, payload)) is not None:
                    raise death
                if pinned and (refusal := pin_refused(upstream.status, payload)) is not None:
                    raise _BeforeFirstByte(f"Dynamo instance {worker} via {route.url}: {refusal}")
                if pinned and (changed := self._weights_changed(route, router)) is not None:
                    raise _BeforeFirstByte(changed, RetryReason.ANSWER_AGAIN)
                if named and upstream.status == 200 and (other := _other_version(payload, route)) is not None:
                    # It restarted on other weights (or moved) since the fence last saw it.
                    raise _BeforeFirstByte(other, RetryReason.ANSWER_AGAIN)
                # An agent puts the spans in a header itself; other engines, at most in the body.
                spans = None if WEIGHT_VERSIONS_HEADER in headers else _weight_versions(payload, upstream.content_type)
                if spans is not None:
                    headers[WEIGHT_VERSIONS_HEADER] = spans
                return web.Response(body=payload, status=upstream.status, headers=headers)
        finally:
            self.in_flight[worker] -= 1
            series.in_flight.dec()

    async def _stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        headers: CIMultiDict[str],
        pinned: Target | None,
        router: Router,
    ) -> web.StreamResponse:
        worker = headers["X-RL-Worker"]
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The client has the headers and part of the stream: say what happened, never cut silently.
            self.failed[worker] += 1
            self.metrics.failed.labels(worker, "mid_stream").inc()
            response[_BROKEN] = True
            log.warning("gateway_stream_broken", worker_id=worker, error=str(exc))
            event = {
                "error": {
                    "code": "worker_failed",
                    "worker": worker,
                    "message": f"worker {worker} failed mid-stream: {type(exc).__name__}: {exc}",
                }
            }
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        else:
            if pinned is not None and (changed := self._weights_changed(pinned, router)) is not None:
                self.failed[worker] += 1
                self.metrics.failed.labels(worker, "mid_stream").inc()
                log.warning("gateway_stream_weights_changed", worker_id=worker, error=changed)
                event = {"error": {"code": "weights_changed", "worker": worker, "message": changed}}
                await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response

    def _weights_changed(self, route: Target, router: Router) -> str | None:
        """Why a pinned member's answer cannot be vouched for: it left service (an update
        cordoned or paused it) or its weights changed while it held the request."""
        in_service, now = router.member_now(route.worker_id)
        if in_service and now == route.weight_version:
            return None
        if now != route.weight_version:
            return (
                f"worker {route.worker_id}'s weights changed from {route.weight_version!r} to {now!r} while it "
                "held the request, so its answer may come from either"
            )
        return (
            f"worker {route.worker_id} left service (an update) while it held the request, so its answer may "
            "come from the next weights"
        )

    def _upstream_headers(self, request: web.Request, route: Target) -> dict[str, str]:
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in self._drop_upstream
            and not (k.lower() == "authorization" and presents_one_of(v, self._own_tokens))
        }
        headers.update(outgoing_headers())
        if route.weight_version is not None:
            headers[EXPECT_VERSION_HEADER] = route.weight_version
        return headers

    @staticmethod
    def _client_headers(upstream: Any, route: Target) -> CIMultiDict[str]:
        headers = CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in HOP_BY_HOP)
        headers["X-RL-Worker"] = route.worker_id
        headers["X-RL-Weight-Version"] = route.weight_version or ""
        return headers


# Set on a stream's response when its worker broke it mid-way: a failure for outlier detection.
_BROKEN = web.ResponseKey("rlcp_gateway_broken", bool)


class RetryReason(Enum):
    """Why a try ended before any byte went to the client, so that another worker may take
    the request: one reason a try, and what it says of the worker."""

    # The worker failed (a connect timeout, a reset, an answer broken off, a refused pin): a try,
    # and counted toward ejecting it.
    FAILED = "failed"
    # It could not be connected to at all (refused: nothing listening; no route, no such host):
    # the request never reached it. Ejected at once; not a try (the request goes elsewhere or waits).
    UNREACHABLE = "unreachable"
    # An agent refused a request meant for other weights: it is healthy and said so, the fence was
    # behind. Not counted toward ejection, or a rolling update would eject the members it has just moved.
    VERSION_REFUSED = "version_refused"
    # The worker's engine was dead when the request arrived (an agent's 503 `engine_dead`): the
    # request never reached it; it is ejected at once.
    ENGINE_DEAD = "engine_dead"
    # A pinned member answered, but left service or changed weights while it held the request:
    # the answer is dropped and the request sent again, not counted as a failure nor as a try.
    ANSWER_AGAIN = "answer_again"


class _BeforeFirstByte(Exception):
    """The try ended before any byte went to the client, for `reason`."""

    def __init__(self, message: str, reason: RetryReason = RetryReason.FAILED) -> None:
        super().__init__(message)
        self.reason = reason


def _connect_failure(exc: BaseException) -> tuple[str, RetryReason]:
    """Why the request could not be sent (or its answer read): the message, and whether the
    worker could not be connected to at all. A TLS failure is not that (something listens and
    answered the handshake), nor a connect timeout (a full backlog times out too), nor a
    pooled connection the worker had closed (`ServerDisconnectedError`)."""
    if isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(exc, aiohttp.ClientSSLError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return f"refused the connection (nothing listening): {exc}", RetryReason.UNREACHABLE
        return f"unreachable: {type(exc).__name__}: {exc}", RetryReason.UNREACHABLE
    return f"{type(exc).__name__}: {exc}", RetryReason.FAILED


def _refusals(refused: dict[str, str]) -> str:
    """The members that could not be connected to for a request, for its error message."""
    if not refused:
        return ""
    said = "; ".join(f"{worker} {why}" for worker, why in list(refused.items())[:8])
    return f"; members that refused this request's connection or could not be reached (not counted as tries): {said}"


class _EngineDied(Exception):
    """The worker's engine died while it served the request: not resent (it may be the cause)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# What vLLM answers (HTTP 500) for a request that meets a dead EngineCore
# (`vllm.v1.engine.exceptions.EngineDeadError`); a stock server has no way to say whether the
# engine was dead before the request arrived, so it counts as died during it.
_VLLM_ENGINE_DEAD = b"EngineCore encountered an issue"


def _engine_death(upstream: aiohttp.ClientResponse, payload: bytes) -> _BeforeFirstByte | _EngineDied | None:
    """The worker's engine is dead, by its 5xx answer: before (`RetryReason.ENGINE_DEAD`) or during
    (`_EngineDied`) this request; None for any other 5xx (which goes to the client unchanged)."""
    if ENGINE_DIED_HEADER in upstream.headers or _VLLM_ENGINE_DEAD in payload:
        error = _error_of(payload)
        message = str(error.get("message")) if error is not None else payload[:200].decode(errors="replace")
        return _EngineDied(message, upstream.status)
    if upstream.status == 503 and (error := _error_of(payload)) is not None and error.get("code") == ENGINE_DEAD:
        return _BeforeFirstByte(f"engine dead: {error.get('message')}", RetryReason.ENGINE_DEAD)
    return None


def _error_of(payload: bytes) -> dict[str, Any] | None:
    """The `error` object of a JSON error answer (vLLM's, an agent's), or None."""
    try:
        error = json.loads(payload).get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, dict) else None


async def _version_refusal(upstream: aiohttp.ClientResponse) -> str | None:
    """An agent's refusal of a request that expected other weights, as the reason; None for
    any other 409 (which goes to the client unchanged)."""
    try:
        body = await upstream.json(content_type=None)
        error = body["error"]
        return str(error["message"]) if error.get("code") == VERSION_MISMATCH else None
    except (ValueError, TypeError, KeyError, AttributeError, aiohttp.ClientError):
        return None


def _weight_versions(payload: bytes, content_type: str) -> str | None:
    """The engine's version spans in the body (vLLM's tokens-in/tokens-out answers carry them
    per choice), as the header's JSON: one list of spans per choice."""
    if content_type != "application/json" or b"weight_versions" not in payload:
        return None
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    choices = [c.get("weight_versions") for c in body.get("choices") or [] if isinstance(c, dict)]
    if not any(choices):
        # SGLang: one request's spans in `meta_info` (native /generate, a list for a batch) or
        # `metadata` (its OpenAI routes).
        metas = body.get("meta_info"), body.get("metadata")
        choices = [m.get("weight_versions") for m in metas if isinstance(m, dict)]
        if not any(choices):
            return None
    return json.dumps([c or [] for c in choices], separators=(",", ":"))


def _other_version(payload: bytes, route: Target) -> str | None:
    """Why an answer that names its weights' version (SGLang's `meta_info` / `metadata`
    `weight_version`) cannot be vouched for: it names another version than the fence chose the
    member at. None when it names that one or none."""
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    answers = body if isinstance(body, list) else [body]  # /generate answers a list for a batch
    for answer in answers:
        if not isinstance(answer, dict):
            continue
        for key in ("meta_info", "metadata"):
            meta = answer.get(key)
            said = meta.get("weight_version") if isinstance(meta, dict) else None
            if said is not None and str(said) != route.weight_version:
                return (
                    f"worker {route.worker_id} answered from weights {said!r}, not {route.weight_version!r} "
                    "the fence chose it at (it restarted or moved since)"
                )
    return None

"""One try: the request sent to the member the fence chose, and its answer handed on.

The worker's status, headers and body come back unchanged, plus `X-RL-Worker` and
`X-RL-Weight-Version` (the version the fence saw it at) and, when the engine reports them,
`X-RL-Weight-Versions` (`answers.py`). A member of a flavor without an inference port of its
own (Dynamo) is reached through its frontend with the request pinned to it (`pinning.py`); a
frontend that refuses the pin is that member's failure, like a broken connection, never an
unpinned answer. Such a member cannot refuse a request sent for other weights either (an agent
answers 409), and a request that reached its engine's queue but not its batch when it paused
runs after the resume, on the new weights (vLLM's wait-mode pause drains only what runs; seen in
tests/e2e/test_dynamo_rollouts.py, answered ~20 ms after the resume, before the controller had
read the new version). So an answer from a pinned member is handed on only if the member is
still in service at the version it was sent at; a member whose answers name their weights
(SGLang) is held to the fence's version by the answer itself.

Whatever ends the try before the first byte reaches the client raises `TryFailed` with its
reason (`retry.py` says what follows); a stream that breaks once its headers went out ends with
an SSE error event instead (`worker_failed`, or `weights_changed` for a pinned member that left
service meanwhile), and the try is a failure for the worker's circuit.
"""

from __future__ import annotations

import json

import structlog
from aiohttp import web
from multidict import CIMultiDict

from rlcp.controlplane.gateway.answers import (
    engine_death,
    other_version,
    version_refusal,
    weight_versions,
    weights_changed,
)
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.pinning import pin_refused, pinned_body
from rlcp.controlplane.gateway.retry import RetryReason, TryFailed, connect_failure
from rlcp.controlplane.gateway.routing import Router, Target
from rlcp.controlplane.gateway.upstream import Answer, UpstreamError, UpstreamPool
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.http import HOP_BY_HOP, presents_one_of
from rlcp.core.tracing import REQUEST_ID_HEADER, TRACEPARENT_HEADER, outgoing_headers
from rlcp.core.wire.agent.inference import EXPECT_VERSION_HEADER, WEIGHT_VERSIONS_HEADER

log = structlog.get_logger("rlcp.controlplane.gateway")

WORKER_HEADER = "X-RL-Worker"
VERSION_HEADER = "X-RL-Weight-Version"
_HOP_BY_HOP = tuple(HOP_BY_HOP)


class Sender:
    """Sends tries over the gateway's upstream pool (`upstream.py`), and keeps the per-worker
    counts a try moves (`in_flight`, `routed`, and `failed` for a stream broken mid-way: the gateway's)."""

    def __init__(
        self,
        *,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        own_tokens: tuple[str, ...],
        in_flight: dict[str, int],
        routed: dict[str, int],
        failed: dict[str, int],
    ) -> None:
        self.metrics = metrics
        self.in_flight, self.routed, self.failed = in_flight, routed, failed
        # The gateway's tokens (its own, the controller's) are not the workers' to see; any other
        # Authorization (a key a worker itself checks) passes. The request id and trace go on as
        # this call's (`rlcp.core.tracing`): a new span per try.
        self._own_tokens = own_tokens
        self._drop = HOP_BY_HOP | {
            EXPECT_VERSION_HEADER.lower(),
            REQUEST_ID_HEADER.lower(),
            TRACEPARENT_HEADER.lower(),
        }
        # Idle connections let go of before the workers close them; each request's deadline is
        # `request_timeout_s` from its start to its answer's last byte, the connect's within it.
        self.upstream = UpstreamPool(
            idle_s=settings.upstream_idle_timeout_s,
            connect_s=settings.connect_timeout_s,
            total_s=settings.request_timeout_s,
        )

    async def send(
        self, request: web.Request, body: bytes, route: Target, router: Router
    ) -> tuple[web.StreamResponse, bool]:
        """The answer handed on, and whether the worker served (a 5xx, or a stream broken
        mid-way, is a failure for its circuit). Raises `TryFailed` before the first byte."""
        worker = route.worker_id
        self.in_flight[worker] += 1  # `/metrics` reads them (`metrics.py`)
        self.routed[worker] += 1
        try:
            if route.pinned:
                try:
                    body = pinned_body(body, worker)
                except ValueError as exc:
                    raise TryFailed(str(exc)) from exc
            try:
                answer = await self.upstream.request(
                    route.url,
                    request.method,
                    request.rel_url.raw_path_qs,
                    self._upstream_headers(request, route),
                    body,
                )
            except UpstreamError as exc:
                raise connect_failure(exc) from exc
            try:
                return await self._answer(request, answer, route, router)
            finally:
                answer.release()
        finally:
            self.in_flight[worker] -= 1

    async def _answer(
        self, request: web.Request, answer: Answer, route: Target, router: Router
    ) -> tuple[web.StreamResponse, bool]:
        status = answer.status
        if answer.streamed and status != 409:
            headers = self._client_headers(answer.headers, route)
            return await self._stream(request, answer, headers, route, router)
        try:
            payload = await answer.read()  # a stream's only for a 409, which an agent answers in JSON
        except UpstreamError as exc:
            raise TryFailed(f"the answer broke off: {type(exc).__name__}: {exc}") from exc
        if status == 409 and (refusal := version_refusal(payload)) is not None:
            # An agent whose weights are no longer the ones the fence saw (it restarted, or
            # changed them since the controller last read it): another worker serves.
            raise TryFailed(refusal, RetryReason.VERSION_REFUSED, status=409)
        headers = self._client_headers(answer.headers, route)
        if status >= 500 and (death := engine_death(status, answer.headers, payload)) is not None:
            raise death
        if route.pinned:
            if (refusal := pin_refused(status, payload)) is not None:
                raise TryFailed(f"Dynamo instance {route.worker_id} via {route.url}: {refusal}")
            if (changed := weights_changed(route, *router.member_now(route.worker_id))) is not None:
                raise TryFailed(changed, RetryReason.ANSWER_AGAIN)
        if route.names_version and status == 200 and (other := other_version(payload, route)) is not None:
            # It restarted on other weights (or moved) since the fence last saw it.
            raise TryFailed(other, RetryReason.ANSWER_AGAIN)
        # An agent puts the spans in a header itself; other engines, at most in the body.
        if WEIGHT_VERSIONS_HEADER not in headers and (spans := weight_versions(payload, answer.content_type)):
            headers[WEIGHT_VERSIONS_HEADER] = spans
        return web.Response(body=payload, status=status, headers=headers), status < 500

    async def _stream(
        self,
        request: web.Request,
        answer: Answer,
        headers: CIMultiDict[str],
        route: Target,
        router: Router,
    ) -> tuple[web.StreamResponse, bool]:
        worker = route.worker_id
        response = web.StreamResponse(status=answer.status, headers=headers)
        await response.prepare(request)
        event: dict[str, object] | None = None
        broken = False  # by the worker, mid-way: a failure for its circuit
        try:
            while chunk := await answer.read_chunk():
                await response.write(chunk)
        except UpstreamError as exc:
            # The client has the headers and part of the stream: say what happened, never cut silently.
            broken = True
            log.warning("gateway_stream_broken", worker_id=worker, error=str(exc))
            message = f"worker {worker} failed mid-stream: {type(exc).__name__}: {exc}"
            event = {"error": {"code": "worker_failed", "worker": worker, "message": message}}
        else:
            if (route.pinned or route.names_version) and (
                changed := weights_changed(route, *router.member_now(worker))
            ) is not None:
                log.warning("gateway_stream_weights_changed", worker_id=worker, error=changed)
                event = {"error": {"code": "weights_changed", "worker": worker, "message": changed}}
        if event is not None:
            self.failed[worker] += 1
            self.metrics.failed.labels(worker, "mid_stream").inc()
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write_eof()
        return response, answer.status < 500 and not broken

    def _upstream_headers(self, request: web.Request, route: Target) -> dict[str, str]:
        headers = {}
        for k, v in request.headers.items():
            name = k.lower()
            if name not in self._drop and not (name == "authorization" and presents_one_of(v, self._own_tokens)):
                headers[k] = v
        headers.update(outgoing_headers())
        if route.weight_version is not None:
            headers[EXPECT_VERSION_HEADER] = route.weight_version
        return headers

    @staticmethod
    def _client_headers(headers: CIMultiDict[str], route: Target) -> CIMultiDict[str]:
        # The answer's own, the hop-by-hop ones dropped (in C): a third of filtering each header in Python.
        for name in _HOP_BY_HOP:
            headers.popall(name, None)
        headers[WORKER_HEADER] = route.worker_id
        headers[VERSION_HEADER] = route.weight_version or ""
        return headers

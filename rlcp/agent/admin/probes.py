"""The agent's probes: liveness (`/healthz`), readiness (`/readyz`) and Prometheus metrics
(`/metrics`), open without the token even when reads are protected (the app's open paths)."""

from __future__ import annotations

from aiohttp import web

from rlcp.agent.admin.handling import agent_service
from rlcp.core.http import json_response
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.agent import (
    ProbeAnswer,
)

_PROBES = "probes"
api = RouteTable(tag=_PROBES)


@api.get(
    "/healthz",
    "Liveness: 200 while the engine is alive.",
    ok=ProbeAnswer,
    answers={503: ProbeAnswer},
    probe=True,
)
async def healthz(request: web.Request) -> web.Response:
    service = agent_service(request)
    alive = service.engine.is_alive()
    return json_response({"status": "ok" if alive else "engine_dead"}, status=200 if alive else 503)


@api.get(
    "/readyz",
    "Readiness: 503 with the reason while not ready.",
    ok=ProbeAnswer,
    answers={503: ProbeAnswer},
    probe=True,
)
async def readyz(request: web.Request) -> web.Response:
    reason = agent_service(request).readiness.not_ready_reason()
    if reason is None:
        return json_response({"status": "ready"})
    return json_response({"status": "not_ready", "reason": reason}, status=503)


@api.get("/metrics", "Prometheus metrics.", ok=str, media_type="text/plain")
async def metrics(request: web.Request) -> web.Response:
    service = agent_service(request)
    body = service.metrics.render(
        paused=service.paused, ready=service.not_ready_reason() is None, requests=service.engine.request_counts()
    )
    return web.Response(body=body, content_type="text/plain", charset="utf-8")

"""The agent's probes: liveness (`/healthz`), readiness (`/readyz`) and Prometheus metrics
(`/metrics`), open without the token even when reads are protected (the app's open paths)."""

from __future__ import annotations

from aiohttp import web

from rlcp.agent.admin.handling import agent_service
from rlcp.agent.service import AgentService
from rlcp.core.http import json_response
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.agent import (
    ProbeAnswer,
)

_PROBES = "probes"
api = RouteTable(tag=_PROBES, context=agent_service)


async def _alive(service: AgentService, _: None) -> tuple[bool, dict[str, object]]:
    alive = service.engine.is_alive()
    return alive, {"status": "ok" if alive else "engine_dead"}


async def _ready(service: AgentService, _: None) -> tuple[bool, dict[str, object]]:
    reason = service.readiness.not_ready_reason()
    return reason is None, {"status": "ready"} if reason is None else {"status": "not_ready", "reason": reason}


def _probe_answer(verdict: tuple[bool, dict[str, object]]) -> web.Response:
    passed, body = verdict
    return json_response(body, status=200 if passed else 503)


# A probe: 200 while its check passes, else 503 saying why, both in the probe's shape.
for _path, _summary, _check in (
    ("/healthz", "Liveness: 200 while the engine is alive.", _alive),
    ("/readyz", "Readiness: 503 with the reason while not ready.", _ready),
):
    api.serve(
        "GET",
        _path,
        _summary,
        _check,
        respond=_probe_answer,
        ok=ProbeAnswer,
        answers={503: ProbeAnswer},
        probe=True,
    )


@api.get("/metrics", "Prometheus metrics.", ok=str, media_type="text/plain")
async def metrics(request: web.Request) -> web.Response:
    service = agent_service(request)
    body = service.metrics.render(
        paused=service.paused, ready=service.not_ready_reason() is None, requests=service.engine.request_counts()
    )
    return web.Response(body=body, content_type="text/plain", charset="utf-8")

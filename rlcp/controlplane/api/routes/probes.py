"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.api.handling import controller_of
from rlcp.core.http import json_response
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.agent.state import ProbeAnswer

api = RouteTable(tag="probes")


@api.get("/healthz", "Liveness.", ok=ProbeAnswer, probe=True)
async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


@api.get("/readyz", "Readiness: discovery has synced.", ok=ProbeAnswer, answers={503: ProbeAnswer}, probe=True)
async def readyz(request: web.Request) -> web.Response:
    ctl = controller_of(request)
    leader = ctl.leadership.leader_identity
    if not ctl.registry.membership.synced:
        return json_response(
            {"status": "not_ready", "reason": "discovery has not synced", "leader": leader}, status=503
        )
    if leader is None:
        return json_response({"status": "not_ready", "reason": "no leader is elected yet", "leader": None}, status=503)
    return json_response({"status": "ready", "leader": leader, "leading": ctl.leadership.is_leader})


@api.get("/metrics", "Prometheus metrics.", ok=str, media_type="text/plain")
async def metrics(request: web.Request) -> web.Response:
    ctl = controller_of(request)
    ready = sum(1 for r in ctl.members() if ctl.worker_view(r).ready)
    return web.Response(body=ctl.metrics.render(ready), content_type="text/plain", charset="utf-8")

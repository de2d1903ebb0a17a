"""What every admin route module shares (`routes.py`, `extras.py`, `probes.py`): the app key
the service is kept under, how a handler reaches it, and the engine's error statuses."""

from __future__ import annotations

from aiohttp import web

from rlcp.agent.service import AgentService

SERVICE = web.AppKey("service", AgentService)

# The engine answers every primitive under a deadline: 502 it failed, 503 it is dead, 504 too slow;
# 409 another mutating operation is running.
ENGINE_ERRORS = (409, 502, 503, 504)


def agent_service(request: web.Request) -> AgentService:
    return request.app[SERVICE]

"""What every admin route module shares (`routes.py`, `extras.py`, `probes.py`): the app key
the service is kept under, how a handler reaches it, the engine's error statuses, and how a
route declared as an entry (the service call it runs, the answer it makes) is served."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from rlcp.agent.service import AgentService
from rlcp.core.openapi import RouteTable

SERVICE = web.AppKey("service", AgentService)

# The engine answers every primitive under a deadline: 502 it failed, 503 it is dead, 504 too slow;
# 409 another mutating operation is running.
ENGINE_ERRORS = (409, 502, 503, 504)

# An entry's answer: the same every time, or made from what the route read and what the call returned.
Answer = Mapping[str, object] | Callable[[Any, Any], Any]


def agent_service(request: web.Request) -> AgentService:
    return request.app[SERVICE]


def serve_engine_call(
    table: RouteTable,
    path: str,
    summary: str,
    run: Callable[[AgentService, Any], Awaitable[Any]],
    answer: Answer,
    **kw: Any,
) -> None:
    """A POST route, in `table` (its context `agent_service`), that drives the engine:
    `run(service, input)`, then `answer`; the engine's errors (`ENGINE_ERRORS`)."""

    async def call(service: AgentService, given: Any) -> Any:
        done = await run(service, given)
        return answer(given, done) if callable(answer) else answer

    table.serve("POST", path, summary, call, errors=ENGINE_ERRORS, **kw)


def serve_read(table: RouteTable, path: str, summary: str, read: Callable[[AgentService, Any], Any], **kw: Any) -> None:
    """A GET route, in `table` (its context `agent_service`), that answers `read(service, input)`:
    a read of the service's own state, touching no engine."""

    async def call(service: AgentService, given: Any) -> Any:
        return read(service, given)

    table.serve("GET", path, summary, call, **kw)

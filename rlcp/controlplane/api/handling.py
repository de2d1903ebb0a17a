"""What every route group of the controller's API shares (`routes/`, the facade): the app keys its
handlers read, how a route that runs a fleet operation is declared (on its handler, or as an entry
naming the operation, served by one handler), and how an operation's result becomes a status.
Operation routes answer an `OperationResult`: 200 every worker ok, 207 some failed, 502 none ok
(a broadcast step: any failed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from rlcp.controlplane.controller import Controller
from rlcp.core.http import json_response
from rlcp.core.openapi import Handler, RouteTable
from rlcp.core.wire.controller.operations import OperationResult

CONTROLLER = web.AppKey("controller", Controller)
SESSION = web.AppKey("session", aiohttp.ClientSession)  # the one client session for worker calls

# Every write: 409 another operation runs (or this replica does not lead, or a member lacks a
# capability), 503 no members.
WRITE_ERRORS = (409, 503)
PARTIAL: dict[int, Any] = {207: OperationResult, 502: OperationResult}
STEP: dict[int, Any] = {502: OperationResult}  # a broadcast step is one collective: any failure is 502
NATIVE, TRANSFER = "fleet", "weight transfer"  # the document's tags (each group's table's)


def declared(
    *,
    partial: dict[int, Any] = PARTIAL,
    ok: Any = OperationResult,
    errors: tuple[int, ...] = (),
    **kw: Any,
) -> dict[str, Any]:
    """What a route that runs a fleet operation declares besides its method, path and summary:
    it answers the `OperationResult` (`partial`: the statuses of a result not all ok), and every
    write's errors besides its own."""
    return {"ok": ok, "answers": partial, "errors": (*WRITE_ERRORS, *errors), **kw}


def operation(table: RouteTable, method: str, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
    """The declaration, in `table`, of a route that runs a fleet operation, on its handler."""
    return table.route(method, path, summary, **declared(**kw))


# An operation as a route entry names it: run on the request's controller (the table's context,
# `controller_of`) with what the route reads.
Run = Callable[[Controller, Any], Awaitable[OperationResult]]


def serve_operation(table: RouteTable, method: str, path: str, summary: str, run: Run, **kw: Any) -> None:
    """A route, in `table`, that runs a fleet operation and answers its result with its status."""
    table.serve(method, path, summary, run, respond=operation_response, **declared(**kw))


def http_status(result: OperationResult) -> int:
    """200 all ok (or still running, for a step of an open session); 207 some failed;
    502 none ok. Never 200 with an error inside. A broadcast step is one collective: a
    worker that failed it failed the whole step, so any failure there is 502."""
    if result.status in ("ok", "running"):
        return 200
    if result.status == "partial" and not result.kind.startswith("weight_transfer"):
        return 207
    return 502


def operation_response(result: OperationResult) -> web.Response:
    return json_response(result, status=http_status(result))


def controller_of(request: web.Request) -> Controller:
    """The controller of the fleet a request is for (a named fleet's sub-app has its own)."""
    return request.config_dict[CONTROLLER]

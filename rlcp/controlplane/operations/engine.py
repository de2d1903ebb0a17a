"""The guarded engine passthrough (`POST /v1/rl/engine/{route}`, docs/controller.md): one engine route
on one member, the members a selector names, or the whole fleet.

Unlike an unguarded gateway passthrough (any route, any body), a route runs only if the
allowlist (`engine_routes.allow` in the settings, per flavor) names it for the flavor of every
member it would reach; otherwise 403 naming the route, before any worker is touched. It runs as
an operation: under the gate (409 while another runs), recorded in the operations log with a
result per worker (200 / 207 / 502), each worker's answer kept in `detail.answers` (bounded).
When no member took the call and every one refused it as a client error (the engine's 4xx: a
body it cannot read, say), the request was wrong, not the fleet: the answer is that 4xx
(`EngineRefused`, naming each worker and carrying the operation), not a 502.
Afterwards the touched workers' statuses are read again (`run_operation`'s final refresh), so
what the controller tracks (pause state, versions, adapters) reflects whatever the route did.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlcp.controlplane.errors import EngineRefused, InvalidInput, NoMembers, NotFound, RouteNotAllowed
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.fleet.select import read_selector, selected
from rlcp.controlplane.operations.context import OperationContext, Run
from rlcp.controlplane.operations.steps import StepDone
from rlcp.controlplane.operations.transaction import Begin, Call, Open, Steps, run_operation
from rlcp.controlplane.settings.engine_routes import EngineMethod
from rlcp.controlplane.workers.capabilities import ENGINE_ROUTES
from rlcp.controlplane.workers.steps import Step
from rlcp.controlplane.workerspec import Flavor
from rlcp.core.labels import Selector
from rlcp.core.wire.controller import EngineRouteRequest, OperationResult

ANSWER_KEPT_BYTES = 4096  # an engine's answer kept in the operations log, per worker (server_info is large)
# 4xx answers that speak of the controller's own link to the worker (its token, a proxy, the
# worker's read timeout), not of the request: a failure of the fleet (502), not the client's.
_LINK_STATUSES = frozenset({401, 407, 408})
Allowlist = Mapping[Flavor, Mapping[str, EngineMethod]]  # flavor -> route -> HTTP method


def _targets(records: list[WorkerRecord], req: EngineRouteRequest, selector: Selector | None) -> list[WorkerRecord]:
    if req.worker is not None:
        chosen = [r for r in records if r.id == req.worker]
        if records and not chosen:
            raise NotFound(f"no member {req.worker!r}", field="worker")
        return chosen
    chosen = selected(records, selector)
    if records and not chosen:
        raise InvalidInput(f"selector {req.selector!r} matches none of the {len(records)} members", field="selector")
    return chosen


def method_for(route: str, records: list[WorkerRecord], allow: Allowlist) -> EngineMethod:
    """The route's HTTP method, if every member's flavor allows it (and agrees on it); else
    `RouteNotAllowed` naming the route and the flavors that do not allow it."""
    methods = {r.spec.flavor: allow.get(r.spec.flavor, {}).get(route) for r in records}
    refused = sorted(f for f, m in methods.items() if m is None)
    if refused:
        allowed = "; ".join(f"{f}: {', '.join(sorted(allow.get(f, {}))) or 'none'}" for f in refused)
        raise RouteNotAllowed(
            f"engine route {route!r} is not allowed for flavor {', '.join(refused)} "
            f"(allowed: {allowed}; settings engine_routes.allow)",
            field="route",
        )
    if len(set(methods.values())) > 1:
        raise RouteNotAllowed(
            f"engine route {route!r} is allowed with different methods per flavor "
            f"({methods}); name one flavor's members with a selector",
            field="route",
        )
    method = next(iter(methods.values()))
    return method if method is not None else "POST"  # unreachable: refused above


def refusal_status(result: OperationResult, refused: Mapping[str, int]) -> int | None:
    """The 4xx to answer when no member took the call and each one that failed refused it as a
    client error: the status they answered (400 where they differ); else None (a timeout, a
    lost connection, a 5xx or a link status is the fleet's failure: 207/502)."""
    failed = [r.worker_id for r in result.results if r.status in ("error", "timeout")]
    if result.status != "failed" or not failed:
        return None
    statuses: set[int] = set()
    for worker_id in failed:
        status = refused.get(worker_id)
        if status is None or not 400 <= status < 500 or status in _LINK_STATUSES:
            return None
        statuses.add(status)
    return statuses.pop() if len(statuses) == 1 else 400


def _kept(answer: Any) -> Any:
    text = json.dumps(answer, default=str)
    return answer if len(text) <= ANSWER_KEPT_BYTES else f"<{len(text)} bytes, not kept>"


async def run_engine_route(
    ctx: OperationContext, route: str, req: EngineRouteRequest, allow: Allowlist
) -> OperationResult:
    refused: dict[str, int] = {}  # each worker's refusal, by id (filled by the steps)
    result = await run_operation(ctx, engine_route(ctx, route, req, allow, refused))
    status = refusal_status(result, refused)
    if status is not None:
        workers = {r.worker_id: r.message or "refused" for r in result.results if r.status != "ok"}
        named = "; ".join(f"{worker_id}: {why}" for worker_id, why in sorted(workers.items()))
        raise EngineRefused(
            f"engine route {route!r} was refused by every member it reached ({named})",
            status=status,
            workers=workers,
            operation=result,
        )
    return result


def engine_route(
    ctx: OperationContext, route: str, req: EngineRouteRequest, allow: Allowlist, refused: dict[str, int]
) -> Steps:
    """The passthrough's steps: every refusal before the gate (the targets, the allowlist, a GET
    with a body), open (the targets checked again once the gate is held), begin, the one call;
    each worker's refusal status put in `refused`."""
    if req.worker is not None and req.selector is not None:
        raise InvalidInput("give worker or selector, not both", field="selector")
    selector = read_selector(req.selector)

    def check(records: list[WorkerRecord]) -> tuple[list[WorkerRecord], EngineMethod]:
        targets = _targets(records, req, selector)
        if not targets:
            raise NoMembers("the fleet has no members")
        method = method_for(route, targets, allow)
        if method == "GET" and req.body is not None:
            raise InvalidInput(f"engine route {route!r} is a GET: it takes no body", field="body")
        return targets, method

    check(ctx.registry.members())  # every refusal before the gate, the log and any worker
    detail: dict[str, Any] = (
        {"route": route}
        | ({"selector": req.selector} if req.selector is not None else {})
        | ({"worker": req.worker} if req.worker is not None else {})
    )
    run: Run = yield Open("engine", detail, lambda records: check(records)[0])
    yield Begin()
    method = method_for(route, run.members, allow)
    run.tracker.note(workers=[r.id for r in run.members], method=method)
    # Every flavor's driver implements ENGINE_ROUTES (`DriverBase`); one that did not would fail
    # its step, named, rather than be skipped silently.
    done: StepDone[Any] = yield Call(
        Step(
            name="engine",
            label=f"engine:{route}",
            can=ENGINE_ROUTES,
            call=lambda w: w.engine_call(method, route, req.body if method == "POST" else None),
            deadline_s=ctx.deadlines.control_s,
        ),
        run.members,
    )
    refused.update(done.refused)
    run.tracker.note(answers={worker_id: _kept(answer) for worker_id, answer in done.answers.items()})

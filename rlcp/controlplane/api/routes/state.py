"""The fleet's reads: `GET /v1/rl/state` (from the cache, never a fan-out), the members, the operations log."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rlcp.controlplane.api.answers import OperationsAnswer, WorkersListing
from rlcp.controlplane.api.handling import NATIVE, controller_of
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.discovery.http_listing import render_listing
from rlcp.controlplane.errors import NotFound
from rlcp.controlplane.fleet.select import read_selector, selected
from rlcp.controlplane.workers.capabilities import capabilities
from rlcp.core.cached import cached_response
from rlcp.core.http import json_response, validate
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller import FleetState, OperationResult, OperationsQuery, SelectorQuery

api = RouteTable(tag=NATIVE, context=controller_of)


@api.get(
    "/v1/rl/state",
    "The fleet state, from the cache (never a fan-out per request). Carries an `ETag`: "
    "with `If-None-Match` naming it, the answer is 304 with no body while nothing changed; gzip when "
    "`Accept-Encoding` allows it. With `selector`, `workers` lists only the matching members (the rest of "
    "the document is the whole fleet's) and the answer is made afresh, without an `ETag`.",
    query=SelectorQuery,
    ok=FleetState,
    answers={304: None},
)
async def get_state(request: web.Request) -> web.Response:
    ctl = controller_of(request)
    selector = read_selector(validate(SelectorQuery, dict(request.query)).selector)
    if selector is not None:
        state = ctl.state()
        return json_response(
            state.model_copy(update={"workers": [w for w in state.workers if selector.matches(w.labels)]})
        )
    return cached_response(request, etag=ctl.state_etag(), body=ctl.state_body)


async def _workers(ctl: Controller, query: SelectorQuery) -> dict[str, Any]:
    members = selected(ctl.members(), read_selector(query.selector))
    views = {v.id: v for v in (ctl.worker_view(r) for r in members)}
    listing = render_listing(
        [r.spec for r in members],
        namespace=ctl.settings.controller_id,
        serving={i: v.serving for i, v in views.items()},
        capabilities={r.id: capabilities(r.driver) for r in members},
    )
    for entry in listing["workers"]:
        view = views[entry["instance_id"]]
        entry.update(ready=view.ready, weight_version=view.weight_version, reachable=view.reachable)
    listing["membership_epoch"] = ctl.registry.membership.epoch
    return listing


async def _operations(ctl: Controller, query: OperationsQuery) -> dict[str, object]:
    return {"operations": [op.model_dump(mode="json") for op in ctl.log.recent(query.limit)]}


api.serve(
    "GET",
    "/v1/rl/workers",
    "The members, in Dynamo's listing shape plus this project's fields (`labels` among "
    "them); with `selector`, only those whose labels match.",
    _workers,
    query=SelectorQuery,
    ok=WorkersListing,
)
api.serve(
    "GET",
    "/v1/rl/operations",
    "Recent operations, newest first.",
    _operations,
    query=OperationsQuery,
    ok=OperationsAnswer,
)


@api.get(
    "/v1/rl/operations/{id}",
    "One operation, running or recent: its results, and a weight update's progress "
    "and bubble (404 once it is older than the kept history).",
    ok=OperationResult,
    errors=(404,),
    path_params={"id": {"type": "string", "minLength": 1}},
)
async def get_operation(request: web.Request) -> web.Response:
    operation_id = request.match_info["id"]
    found = controller_of(request).log.find(operation_id)
    if found is None:
        raise NotFound(f"no operation {operation_id!r} (running or among the recent ones)", field="id")
    return json_response(found)

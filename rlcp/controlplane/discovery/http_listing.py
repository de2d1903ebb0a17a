"""HTTP listing discovery: poll a `GET /v1/rl/workers` listing for the member list.

The listing is the shape Dynamo's frontend serves (`protocol_version`, `namespace`,
`workers[]` with `instance_id`, `system_url`, `routes`, `world_size`, ...). This
controller serves the same shape with a few fields of its own (`flavor`, `admin_url`,
`inference_url`, `serving`, `labels`), so one controller can discover another's fleet, and the
controller's route reuses `render_listing` / `parse_listing` from here.

    parse_listing   listing document -> [WorkerSpec]   (pure; bad entries skipped)
    render_listing  [WorkerSpec] -> listing document   (pure; the inverse)
    HttpListingSource.watch   poll -> parse -> yield; on failure keep quiet and back off (polling.py)

With `format="sglang_router"` the same source polls an sglang-router's `GET /workers` instead
(slime's and Miles' router, where their SGLang servers register): parsed by `sglang_router.py`.

A failed poll yields nothing: the consumer keeps the last membership, because a flaky
listing must never empty the fleet.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from pydantic import ValidationError

from rlcp.controlplane.discovery.polling import HttpPoll, PollFailed, good_entries
from rlcp.controlplane.discovery.sglang_router import parse_router_workers
from rlcp.controlplane.settings.discovery import ListingFormat
from rlcp.controlplane.workers.registry import driver_class
from rlcp.controlplane.workerspec import FLAVORS, Flavor, WorkerSpec
from rlcp.core.labels import labels_from

PROTOCOL_VERSION = 1


def routes_for(flavor: str, capabilities: frozenset[str] | None = None) -> list[str]:
    """The routes of a member of `flavor` that can do `capabilities` (all of the flavor's
    when unknown). The flavor's class says which (`listing_routes`): a dynamo member is listed with
    Dynamo's own engine route names, so a controller reading this listing with flavor dynamo narrows
    its capabilities exactly as it does reading Dynamo's frontend."""
    facts = driver_class(flavor)
    table = facts.listing_routes
    caps = table.keys() if capabilities is None else [c for c in table if c in capabilities]
    return sorted({*facts.status_routes, *(route for cap in caps for route in table[cap])})


class ListingError(PollFailed):
    """The listing as a whole is unusable (unreachable, non-200, malformed): a failed poll."""


def parse_listing(body: Any, *, default_flavor: Flavor, inference_url: str | None = None) -> list[WorkerSpec]:
    """Turn a listing document into specs. A malformed top level raises `ListingError`;
    one bad entry is logged and skipped, so it cannot take the rest of the fleet down.
    `inference_url`: for entries that name none (Dynamo's never do: its workers take
    inference only through the frontend, whose HTTP port the listing does not name)."""
    if not isinstance(body, Mapping):
        raise ListingError(f"listing is a {type(body).__name__}, not an object")
    version = body.get("protocol_version")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise ListingError(f"unsupported protocol_version {version!r} (expected {PROTOCOL_VERSION})")
    entries = body.get("workers")
    if not isinstance(entries, list):
        raise ListingError("listing has no 'workers' list")
    return good_entries(
        entries,
        lambda entry: _parse_entry(entry, default_flavor, inference_url),
        key="instance_id",
        event="listing_entry_skipped",
    )


def _parse_entry(entry: Any, default_flavor: Flavor, inference_url: str | None) -> tuple[WorkerSpec | None, str]:
    if not isinstance(entry, Mapping):
        return None, "entry is not an object"
    raw_id = entry.get("instance_id")
    # Dynamo's instance ids are integers; ours are strings. A bool is neither.
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or raw_id == "":
        return None, "no instance_id"
    admin_url = entry.get("admin_url") or entry.get("admin_base_url") or entry.get("system_url")
    if not isinstance(admin_url, str):
        return None, "no admin_url, admin_base_url or system_url"
    flavor = entry.get("flavor") or default_flavor
    if flavor not in FLAVORS:
        return None, f"unknown flavor {flavor!r} (known: {', '.join(sorted(FLAVORS))})"
    routes = entry.get("routes")
    if routes is not None and not (isinstance(routes, list) and all(isinstance(r, str) for r in routes)):
        return None, "routes is not a list of strings"
    try:
        labels = labels_from(entry.get("labels"))
    except ValueError as exc:
        return None, f"labels: {exc}"
    try:
        spec = WorkerSpec(
            id=str(raw_id),
            admin_url=admin_url,
            inference_url=entry.get("inference_url") or inference_url,
            flavor=flavor,
            world_size=entry.get("world_size") or 1,
            model=entry.get("model"),
            routes=tuple(routes) if routes is not None else None,
            labels=labels,
        )
    except ValidationError as exc:
        return None, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return spec, ""


def render_listing(
    specs: list[WorkerSpec],
    *,
    namespace: str,
    serving: Mapping[str, bool] | None = None,
    capabilities: Mapping[str, frozenset[str]] | None = None,
) -> dict[str, Any]:
    """The listing document for `specs`. `system_url` repeats `admin_url` so a reader that
    only knows Dynamo's fields still finds the admin port. With `serving` given, a worker
    missing from it is reported not serving; without it the field is left out (unknown).
    `routes` are what each member can do (`capabilities` by id, e.g. its driver's, narrowed
    by the routes it published); for a member not in it, everything its flavor can do."""
    workers = []
    for spec in specs:
        entry: dict[str, Any] = {
            "instance_id": spec.id,
            "system_url": spec.admin_url,
            "admin_url": spec.admin_url,
            "inference_url": spec.inference_url,
            "flavor": spec.flavor,
            "world_size": spec.world_size,
            "model": spec.model,
            "labels": dict(spec.labels),
            "routes": routes_for(spec.flavor, capabilities.get(spec.id) if capabilities is not None else None),
        }
        if serving is not None:
            entry["serving"] = bool(serving.get(spec.id, False))
        workers.append(entry)
    return {"protocol_version": PROTOCOL_VERSION, "namespace": namespace, "workers": workers}


class HttpListingSource:
    name = "http_listing"

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        url: str,
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
        token: str | None = None,
        default_flavor: Flavor = "dynamo",
        max_backoff_s: float = 30.0,
        iterations: int | None = None,
        inference_url: str | None = None,
        format: ListingFormat = "rl_workers",
    ) -> None:
        if default_flavor not in FLAVORS:
            raise ValueError(f"unknown default_flavor {default_flavor!r}")
        self._http = HttpPoll(
            session,
            url,
            source="listing" if format == "rl_workers" else format,
            error=ListingError,
            interval_s=interval_s,
            timeout_s=timeout_s,
            max_backoff_s=max_backoff_s,
            token=token,
            iterations=iterations,
        )
        self._default_flavor: Flavor = default_flavor
        self._inference_url = inference_url
        self._format: ListingFormat = format

    def watch(self) -> AsyncIterator[list[WorkerSpec]]:
        return self._http.repeat(self.poll)

    async def poll(self) -> list[WorkerSpec]:
        """One GET under one deadline; every way it can fail becomes a `ListingError`."""
        body = await self._http.get()
        if self._format == "sglang_router":
            return parse_router_workers(body, error=ListingError)
        return parse_listing(body, default_flavor=self._default_flavor, inference_url=self._inference_url)

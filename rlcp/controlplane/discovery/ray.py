"""Ray discovery: members from a Ray cluster's actors, read through the dashboard's state API.

RL frameworks place their engines as Ray actors; the controller finds them without importing
`ray`, by polling `GET {dashboard}/api/v0/actors?detail=true` (plain HTTP, ~10 ms). An actor
says how to reach it through its `__repr__`, which the state API carries verbatim as
`repr_name` (docs/ray.md, "The actor convention"):

    {"rlcp": 1, "admin_url": "http://10.0.0.5:9000", "inference_url": "http://10.0.0.5:8000",
     "flavor": "agent", "world_size": 1, "model": "Qwen/Qwen3-0.6B", "labels": {"role": "policy"}}

    parse_actors         state API answer -> ActorList (specs, states, skipped)   (pure)
    RayActorSource.watch poll -> parse -> yield; on failure keep quiet and back off

The member id is the actor's name (`namespace/name` when no namespace is configured), or its
actor id when it has none. A RESTARTING or DEAD actor stays a member: its status reads fail,
so it shows unreachable; it is never dropped silently. Its `num_restarts` is the spec's
`incarnation`, so a restart is a changed spec: the registry starts the member afresh and the
controller converges it again before it serves.

A failed poll (dashboard unreachable, non-200, malformed, or a list the server truncated)
yields nothing: the consumer keeps the last membership.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from pydantic import ValidationError

from rlcp.controlplane.discovery.polling import HttpPoll, PollFailed
from rlcp.controlplane.settings.discovery import DeadActors
from rlcp.controlplane.workerspec import FLAVORS, Flavor, WorkerSpec
from rlcp.core.labels import labels_from

log = structlog.get_logger("rlcp.controlplane.discovery.ray")

CONVENTION_VERSION = 1  # the `rlcp` key of an actor's description
# Ray's actor states (`ray.util.state.common.ActorState`). Only these two say the process behind
# the URL is gone; a member in either is kept and reads as unreachable.
DOWN_STATES = frozenset({"RESTARTING", "DEAD"})


class RayStateError(PollFailed):
    """The state API's answer as a whole is unusable: a failed poll."""


@dataclass(frozen=True)
class ActorList:
    """What one answer holds: the members, each member's actor state, and the actors the filters
    selected that are not members, with why."""

    specs: list[WorkerSpec]
    states: dict[str, str]
    skipped: list[Skipped]


@dataclass(frozen=True)
class Skipped:
    """An actor the filters selected that is not a member, and why."""

    actor_id: str
    name: str
    reason: str


def member_id(actor: Mapping[str, Any], *, qualify: bool) -> str:
    """The actor's name (with its namespace when `qualify`), or its actor id when unnamed."""
    name = actor.get("name") or ""
    if not name:
        return str(actor.get("actor_id") or "")
    return f"{actor.get('ray_namespace') or ''}/{name}" if qualify else name


def parse_actors(
    body: Any,
    *,
    namespace: str | None = None,
    name_prefix: str | None = None,
    class_name: str | None = None,
    default_flavor: Flavor = "agent",
    dead_actors: DeadActors = "keep",
) -> ActorList:
    """Turn a state API answer (`/api/v0/actors?detail=true`) into specs. The filters are applied
    here too (the server applies namespace and class; a name prefix only here). A malformed or
    truncated answer raises `RayStateError`; one bad actor is skipped with its reason."""
    actors = _actor_list(body)
    specs: dict[str, WorkerSpec] = {}
    states: dict[str, str] = {}
    skipped: list[Skipped] = []
    for actor in actors:
        if not isinstance(actor, Mapping):
            skipped.append(Skipped("", "", "entry is not an object"))
            continue
        if namespace is not None and actor.get("ray_namespace") != namespace:
            continue
        if class_name is not None and actor.get("class_name") != class_name:
            continue
        if name_prefix is not None and not str(actor.get("name") or "").startswith(name_prefix):
            continue
        state = str(actor.get("state") or "")
        if state == "DEAD" and dead_actors == "drop":
            skipped.append(
                Skipped(
                    str(actor.get("actor_id") or ""),
                    str(actor.get("name") or ""),
                    "DEAD (discovery.ray.dead_actors: drop)",
                )
            )
            continue
        spec, reason = _parse_actor(actor, qualify=namespace is None, default_flavor=default_flavor)
        if spec is None:
            skipped.append(Skipped(str(actor.get("actor_id") or ""), str(actor.get("name") or ""), reason))
            continue
        if spec.id in specs:
            # A detached name is free again once its actor is DEAD, so a new actor may take it: the
            # live one is the member. Two live ones cannot share a name in one namespace.
            if states[spec.id] != "DEAD" and state == "DEAD":
                continue
            if not (states[spec.id] == "DEAD" and state != "DEAD"):
                skipped.append(
                    Skipped(
                        str(actor.get("actor_id") or ""),
                        str(actor.get("name") or ""),
                        f"duplicate member id {spec.id!r}",
                    )
                )
                continue
        specs[spec.id], states[spec.id] = spec, state
    return ActorList(list(specs.values()), states, skipped)


def _actor_list(body: Any) -> list[Any]:
    if not isinstance(body, Mapping):
        raise RayStateError(f"answer is a {type(body).__name__}, not an object")
    if body.get("result") is not True:
        raise RayStateError(f"state API refused: {body.get('msg') or 'result is not true'}")
    data = body.get("data")
    inner = data.get("result") if isinstance(data, Mapping) else None
    actors = inner.get("result") if isinstance(inner, Mapping) else None
    if not isinstance(inner, Mapping) or not isinstance(actors, list):
        raise RayStateError("answer has no data.result.result list")
    # A partial list would remove members that are still there, so both of Ray's truncations are
    # failed polls: the GCS answering fewer actors than it has (`num_after_truncation < total`),
    # and the dashboard cutting the filtered list at `limit` (fewer returned than `num_filtered`:
    # measured on Ray 2.60.0, limit=2 over 8 actors answers total=8, num_after_truncation=8,
    # num_filtered=8 and two actors).
    total, kept, matched = inner.get("total"), inner.get("num_after_truncation"), inner.get("num_filtered")
    if isinstance(total, int) and isinstance(kept, int) and kept < total:
        raise RayStateError(f"the state API read {kept} of {total} actors (raise discovery.ray.limit)")
    if isinstance(matched, int) and len(actors) < matched:
        raise RayStateError(
            f"the state API returned {len(actors)} of {matched} matching actors (raise discovery.ray.limit)"
        )
    return actors


def _parse_actor(actor: Mapping[str, Any], *, qualify: bool, default_flavor: Flavor) -> tuple[WorkerSpec | None, str]:
    wid = member_id(actor, qualify=qualify)
    if not wid:
        return None, "no name and no actor_id"
    raw = actor.get("repr_name")
    if not raw:  # Ray fills repr_name only from a class's own __repr__, once __init__ has returned
        state = actor.get("state")
        if state in ("PENDING_CREATION", "DEPENDENCIES_UNREADY"):
            return None, f"no description yet (state {state}: __repr__ is read once the actor is created)"
        return None, "empty repr_name: the actor class has no __repr__ of its own (see docs/ray.md)"
    try:
        described = json.loads(raw)
    except (TypeError, ValueError):
        return None, "__repr__ is not a JSON object (see docs/ray.md, the actor convention)"
    if (
        not isinstance(described, Mapping)
        or described.get("rlcp") != CONVENTION_VERSION
        or isinstance(described.get("rlcp"), bool)
    ):
        return None, f'__repr__ has no "rlcp": {CONVENTION_VERSION}'
    admin_url = described.get("admin_url")
    if not isinstance(admin_url, str) or not admin_url:
        return None, "no admin_url in __repr__"
    flavor = described.get("flavor") or default_flavor
    if flavor not in FLAVORS:
        return None, f"unknown flavor {flavor!r} (known: {', '.join(sorted(FLAVORS))})"
    routes = described.get("routes")
    if routes is not None and not (isinstance(routes, list) and all(isinstance(r, str) for r in routes)):
        return None, "routes is not a list of strings"
    restarts = actor.get("num_restarts")  # an int64 in Ray's protobuf: a string in its JSON
    try:
        labels = labels_from(described.get("labels"))
    except ValueError as exc:
        return None, f"labels in __repr__: {exc}"
    try:
        spec = WorkerSpec(
            id=wid,
            admin_url=admin_url,
            inference_url=described.get("inference_url"),
            flavor=flavor,
            world_size=1 if described.get("world_size") is None else described["world_size"],
            model=described.get("model"),
            routes=tuple(routes) if routes is not None else None,
            incarnation=str(restarts) if restarts is not None else None,
            labels=labels,
        )
    except ValidationError as exc:
        return None, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return spec, ""


def actors_url(dashboard_url: str) -> str:
    return dashboard_url.rstrip("/") + "/api/v0/actors"


def query(*, namespace: str | None, class_name: str | None, limit: int) -> list[tuple[str, str]]:
    """The state API's query: detail (for `repr_name` and `num_restarts`), the server-side filters
    (equality only: a name prefix is filtered here), and the limit."""
    params = [("detail", "true"), ("limit", str(limit))]
    for key, value in (("ray_namespace", namespace), ("class_name", class_name)):
        if value is not None:
            params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
    return params


class RayActorSource:
    name = "ray"

    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        dashboard_url: str,
        namespace: str | None = None,
        name_prefix: str | None = None,
        class_name: str | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
        max_backoff_s: float = 30.0,
        limit: int = 10000,
        token: str | None = None,
        default_flavor: Flavor = "agent",
        dead_actors: DeadActors = "keep",
        iterations: int | None = None,
    ) -> None:
        if default_flavor not in FLAVORS:
            raise ValueError(f"unknown default_flavor {default_flavor!r}")
        self._http = HttpPoll(
            session,
            actors_url(dashboard_url),
            source="ray",
            error=RayStateError,
            interval_s=interval_s,
            timeout_s=timeout_s,
            max_backoff_s=max_backoff_s,
            token=token,
            params=query(namespace=namespace, class_name=class_name, limit=limit),
            iterations=iterations,
        )
        self._filters: dict[str, Any] = dict(
            namespace=namespace,
            name_prefix=name_prefix,
            class_name=class_name,
            default_flavor=default_flavor,
            dead_actors=dead_actors,
        )
        self._logged_skips: set[Skipped] = set()
        self._logged_down: dict[str, str] = {}  # member id -> the state last logged

    def watch(self) -> AsyncIterator[list[WorkerSpec]]:
        return self._http.repeat(self.poll)

    async def poll(self) -> list[WorkerSpec]:
        """One GET under one deadline; every way it can fail becomes a `RayStateError`."""
        body = await self._http.get()
        found = parse_actors(body, **self._filters)
        self._log(found)
        return found.specs

    def _log(self, found: ActorList) -> None:
        """Each skip and each member's down state once, when it first appears, not every poll."""
        for skip in found.skipped:
            if skip not in self._logged_skips:
                log.warning("ray_actor_skipped", actor_id=skip.actor_id, name=skip.name, reason=skip.reason)
        self._logged_skips = set(found.skipped)
        down = {wid: state for wid, state in found.states.items() if state in DOWN_STATES}
        for wid, state in down.items():
            if self._logged_down.get(wid) != state:
                log.warning(
                    "ray_actor_down",
                    worker_id=wid,
                    state=state,
                    hint="kept as a member: its status reads fail, so it shows unreachable",
                )
        self._logged_down = down

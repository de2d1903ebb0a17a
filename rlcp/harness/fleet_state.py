"""A fleet state written by hand, for what reads one without a controller behind it: the gateway's
own tests and benchmark (a `Router` or a follower over a state a test sets), Envoy's endpoints.

    serving_fleet([serving_worker("w0", "http://127.0.0.1:8000")])

Each member serves weights `v1` unless a test says otherwise (any `WorkerView` field by keyword);
the fleet is at rest on `v1` (any `FleetState` field by keyword)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from rlcp.core.wire.agent.state import RequestCounts
from rlcp.core.wire.controller import AppliedState, DesiredState, FleetState, WorkerView


def serving_worker(
    worker_id: str, inference_url: str, *, flavor: str = "agent", admin_url: str = "http://127.0.0.1:1", **fields: Any
) -> WorkerView:
    """A member serving weights `v1`: reachable, ready, in service, not paused; `fields` replace any of that."""
    base: dict[str, Any] = dict(
        id=worker_id,
        admin_url=admin_url,
        inference_url=inference_url,
        flavor=flavor,
        world_size=1,
        reachable=True,
        ready=True,
        serving=True,
        paused=False,
        requests=None,
        weight_version="v1",
        loras={},
        engine_alive=True,
    )
    return _made(WorkerView, base, fields)


def serving_fleet(workers: list[WorkerView], **fields: Any) -> FleetState:
    """A fleet at rest on `v1` (desired, applied, verified) through `workers`; `fields` replace any of that."""
    base: dict[str, Any] = dict(
        phase="serving",
        quiesced=False,
        pause_state="running",
        requests=RequestCounts(running=0, waiting=0, frozen=0),
        desired=DesiredState(weight_version="v1", applied_versions=["v1"]),
        applied=AppliedState(weight_version="v1", converged=True, verified=True),
        membership_epoch=1,
        discovery_synced=True,
        last_operation=None,
        workers=workers,
    )
    return _made(FleetState, base, fields)


_Model = TypeVar("_Model", bound=BaseModel)


def _made(model: type[_Model], base: dict[str, Any], fields: dict[str, Any]) -> _Model:
    # The wire models ignore unknown keys; a misspelt field here would leave the default quietly.
    if unknown := sorted(set(fields) - set(model.model_fields)):
        raise TypeError(f"{model.__name__} has no field {', '.join(unknown)}")
    return model.model_validate(base | fields)

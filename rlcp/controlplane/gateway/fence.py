"""The version fence: which members may be sent a request now. Pure code over the state.

A member is inside the fence when it is reachable, not paused, not cordoned (taken out of
service by an update), has an inference URL, its engine is not known dead, and its weights
are at an admitted version: the desired one (and then it must be ready: at the desired
adapters too), or, with a staleness bound k, one of the k versions the controller applied
just before it. A member the controller has not
placed at an admitted version is never sent a rollout, whatever its own readiness says:
stock vLLM and Dynamo workers cannot gate their own readiness.

Nor is a member reporting a version that is not a valid name (`rlcp.core.wire.versions`): the
gateway puts the version a member was admitted at into request and answer headers, and
such a name (one set on a stock worker by hand, say) would make every request to it fail
in the HTTP client instead of being served. The controller's own names are checked where
they enter; this covers the names workers report, which no request model saw.
"""

from __future__ import annotations

from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.core.wire.controller.state import FleetState, WorkerView
from rlcp.core.wire.versions import is_version_name


def in_fence(view: WorkerView, desired: str | None, admitted: list[str]) -> bool:
    if not (
        view.reachable
        and view.paused is False
        and not view.cordoned
        and view.inference_url
        and view.engine_alive is not False
    ):
        return False
    if view.weight_version is not None and not is_version_name(view.weight_version):
        return False
    if desired is None:
        return view.ready  # nothing desired yet: whatever the controller calls ready
    if view.weight_version == desired:
        return view.ready
    # An older admitted version: its own readiness is gated on the desired version, so only
    # reachability, pause and liveness count (checked above).
    return view.weight_version in admitted


def fence(state: FleetState, bound: int | None = None) -> tuple[list[str], list[WorkerView]]:
    """(admitted versions, members inside the fence). `bound` overrides the desired state's."""
    desired = state.desired.weight_version
    admitted = admitted_versions(
        desired, state.desired.applied_versions, state.desired.staleness_bound if bound is None else bound
    )
    return admitted, [w for w in state.workers if in_fence(w, desired, admitted)]

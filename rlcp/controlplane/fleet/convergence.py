"""Whether a worker is at the desired state: the one rule the state document (`view.py`) and
the reconciler's plan (`reconcile/plan.py`) share. Pure, over typed state."""

from __future__ import annotations

from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.controller.desired import DesiredState


def weights_behind(desired: DesiredState, status: WorkerStatus) -> bool:
    return desired.weight_version is not None and status.weight_version != desired.weight_version


def loras_behind(desired: DesiredState, status: WorkerStatus) -> bool:
    want = {name: spec.version for name, spec in desired.loras.items()}
    return status.loras != want


def converged(desired: DesiredState, status: WorkerStatus) -> bool:
    """At the desired weights and adapters (pause state aside)."""
    return not weights_behind(desired, status) and not loras_behind(desired, status)

"""Reconciliation decisions: what to do to one worker to bring it to the desired state.

Plain code over typed state, no I/O, so every rule is testable without sockets. The
controller runs the plan's actions in order and stops a worker's plan at its first
failure (then backs off). Order matters: a worker is told the desired version first
(so it reports not ready while stale), then gets weights, then adapters, and is
resumed only once nothing else is left to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from rlcp.controlplane.fleet.convergence import weights_behind
from rlcp.controlplane.fleet.desired import load_source, wanted_pause
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.controller.desired import DesiredState

ActionKind = Literal["set_desired", "update_weights", "load_lora", "unload_lora", "pause", "resume", "sleep"]


# One class per action, each with what its driver call takes; `kind` names it in the result
# (`reconcile:<kind>`), the metrics and the deadline.
@dataclass(frozen=True)
class SetDesired:
    kind: ClassVar[ActionKind] = "set_desired"
    version: str | None


@dataclass(frozen=True)
class UpdateWeights:
    kind: ClassVar[ActionKind] = "update_weights"
    path: str
    version: str


@dataclass(frozen=True)
class LoadLora:
    kind: ClassVar[ActionKind] = "load_lora"
    name: str
    path: str
    version: str | None


@dataclass(frozen=True)
class UnloadLora:
    kind: ClassVar[ActionKind] = "unload_lora"
    name: str


@dataclass(frozen=True)
class Pause:
    kind: ClassVar[ActionKind] = "pause"
    mode: PauseMode


@dataclass(frozen=True)
class Resume:
    kind: ClassVar[ActionKind] = "resume"


@dataclass(frozen=True)
class PutToSleep:
    kind: ClassVar[ActionKind] = "sleep"
    level: int


Action = SetDesired | UpdateWeights | LoadLora | UnloadLora | Pause | Resume | PutToSleep


def plan(
    desired: DesiredState,
    status: WorkerStatus,
    *,
    told_desired: str | None | object,
    tracks_desired: bool,
    worker_id: str = "",
) -> list[Action]:
    """Actions that bring one reachable worker to `desired`, in order; [] when it is there.

    `told_desired` is the version this worker was last told (a sentinel when never);
    `tracks_desired` says whether its flavor gates readiness on it (the agent does);
    `worker_id` finds its hold, if a selector-scoped pause holds it (`desired.held`), and
    whether it is kept asleep (`desired.asleep`).
    """
    asleep = desired.asleep.get(worker_id)
    if asleep is not None:
        # Kept asleep: nothing else is done to it (a wake converges and verifies it). One that
        # reports awake -- restarted, or woken behind the controller's back -- goes back to sleep.
        return [PutToSleep(asleep.level)] if status.sleeping is False else []
    if status.sleeping:
        return []  # put to sleep by hand: not resumed onto released memory; a wake through the API verifies it
    actions: list[Action] = []
    if tracks_desired and told_desired != desired.weight_version:
        actions.append(SetDesired(desired.weight_version))
    if weights_behind(desired, status):
        source = load_source(desired)
        if source is None:
            return actions  # nothing to load (a broadcast version, no disk copy): it stays not ready
        if status.weight_version != source["version"]:
            actions.append(UpdateWeights(source["path"], source["version"]))
        if source["version"] != desired.weight_version:
            return actions  # the disk copy is older: out of service until the next broadcast
    for name, spec in desired.loras.items():
        if name not in status.loras or status.loras[name] != spec.version:
            actions.append(LoadLora(name, spec.path, spec.version))
    for name in status.loras:
        if name not in desired.loras:
            actions.append(UnloadLora(name))
    pause = wanted_pause(desired, worker_id)
    if pause is not None and status.paused is False:
        actions.append(Pause(pause))
    elif pause is None and status.paused:
        actions.append(Resume())
    return actions

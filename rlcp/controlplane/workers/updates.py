"""A disk update's steps, as each flavor's driver declares them (issue 46: the one-call or
three-call update lives in the driver, not in the operation).

A wave of a disk update asks each of its members the same thing (`WaveUpdate`: the checkpoint,
the version, the pause, whether the new weights are hashed, the checksums already agreed on,
who resumes as soon as it is loaded); each driver answers with its flavor's steps up to the
load (`UpdateSteps`, from `update_steps`):

- the agent (`flavors/agent.py`): one step, `update_in_one_call` -- told the version, paused,
  loaded, hashed and, when the plan says so, resumed, in one round trip;
- stock vLLM, Dynamo and SGLang (`flavors/base.py`, `SeparateUpdateCalls`): `pause_for_update`,
  then `load_from_disk`; the resume after verification.

The operation (`operations/weights.py`, `Roll.wave`) runs each declaration on the members that
made it, side by side, verifies them together on what the steps answered, and resumes those
that did not resume in their own call: it never asks which protocol a member speaks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

from rlcp.controlplane.deadlines import Deadlines
from rlcp.controlplane.workers.capabilities import Can, DiskWeights, Driver, UpdateReport
from rlcp.controlplane.workers.steps import Step
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent.control import PauseMode


@dataclass(frozen=True, kw_only=True)
class WaveUpdate:
    """One wave of a disk update, as the operation asks it of every member."""

    path: str
    version: str  # loaded as, and desired
    mode: PauseMode
    pause_s: float  # the engine's bound on its pause
    requested_s: float | None  # the request's `timeout_s`, from which the steps' deadlines derive
    checksums: bool  # verification is on: the new weights are hashed where a load can answer them
    expected_checksums: dict[str, str] | None  # held to in the call, where a worker can hold itself
    resumes: Callable[[str], bool]  # whether a worker (by id) resumes as soon as it is loaded
    deadlines: Deadlines


@dataclass(frozen=True)
class UpdateSteps:
    """A flavor's disk update up to the load, declared: `pause` (where there is one), then
    `update`, each run on the workers the one before left. A worker knows the new version once
    its first step succeeded. `update` answers an `UpdateReport` (what a load answered, the
    status if it carries one, whether the worker resumed in it). `uncertain`: a failed `update`
    may have left the worker paused (it pauses in the same call): one that answered an error is
    read again, one that answered nothing counts as paused until a read says otherwise."""

    update: Step[Any, UpdateReport]
    pause: Step[Any, WorkerStatus | None] | None = None
    uncertain: bool = False


@runtime_checkable
class DeclaredUpdate(DiskWeights, Protocol):
    """A `DiskWeights` driver that declares its flavor's update steps (every flavor does)."""

    def update_steps(self, update: WaveUpdate, wave: Sequence[DiskWeights]) -> UpdateSteps:
        """The steps of one wave of `update` for the members of `wave`: those whose drivers
        declare their update as this one does (the same `update_steps`), run as one step each."""


def _declared_update(d: Driver) -> TypeGuard[DeclaredUpdate]:
    return isinstance(d, DeclaredUpdate)


UPDATE_STEPS = Can("update_steps", _declared_update)

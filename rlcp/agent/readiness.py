"""Readiness: whether this agent should get rollouts now, and if not, why.

Not ready while the engine is dead, while it is asleep (its memory released), while a weight
change that failed part-way left the weights unknown, while (with `require_desired_version`) no
controller has told the desired version yet, and while the applied version differs from the
desired one. The desired
version is the controller's word (`PUT /v1/agent/desired`, or the first of an update's
calls); the applied one is the weights' (`rlcp/agent/weight_state.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from rlcp.agent.engine.base import InferenceServing
from rlcp.agent.settings import AgentSettings
from rlcp.agent.weight_state import WeightState

log = structlog.get_logger("rlcp.agent.readiness")


class Readiness:
    def __init__(
        self,
        settings: AgentSettings,
        engine: InferenceServing,
        weights: WeightState,
        *,
        asleep: Callable[[], bool] = lambda: False,
    ) -> None:
        self._settings = settings
        self._asleep = asleep
        self._engine = engine
        self._weights = weights
        self.desired_version: str | None = None
        self._told = False

    def set_desired_version(self, version: str | None) -> None:
        self.desired_version = version
        self._told = True
        log.info("desired_version", desired=version, applied=self._weights.version)

    def not_ready_reason(self) -> str | None:
        if not self._engine.is_alive():
            return "engine is not alive"
        if self._asleep():
            return "engine is asleep (POST /wake_up)"
        if self._weights.broken is not None:
            return self._weights.broken
        if self._settings.require_desired_version and not self._told:
            return "waiting for the controller to tell the desired weight version"
        if self.desired_version is not None and self._weights.version != self.desired_version:
            return f"applied weight version {self._weights.version!r} differs from desired {self.desired_version!r}"
        return None

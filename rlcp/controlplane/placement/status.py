"""What placement keeps and last saw, shared by its loop (the writer) and the API (the reader).

The count to keep is the desired state's `placement_replicas` when an API call set one (it
survives restarts and leader changes with the rest of the desired state), else the setting.
A write wakes the loop, so a scale acts at once instead of at the next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

from rlcp.controlplane.placement.plan import Placed, actor_name, group_name
from rlcp.controlplane.settings.placement import RayPlacementSettings
from rlcp.core.wire.controller.placement import PlacementView


class PlacementStatus:
    def __init__(self, settings: RayPlacementSettings, desired: Callable[[], int | None]) -> None:
        self.settings = settings
        self._desired = desired
        self._wake = asyncio.Event()
        self._placed: Placed | None = None
        self._last_pass_at: datetime | None = None
        self._last_pass_s: float | None = None
        self._last_error: str | None = None

    def replicas(self) -> int:
        desired = self._desired()
        return self.settings.replicas if desired is None else desired

    def wake(self) -> None:
        self._wake.set()

    async def wait(self, timeout_s: float) -> None:
        """Until woken or `timeout_s` passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        self._wake.clear()

    def passed(self, placed: Placed, duration_s: float) -> None:
        self._placed, self._last_error = placed, None
        self._stamp(duration_s)

    def failed(self, error: str, duration_s: float) -> None:
        self._last_error = error  # the last actors seen stay: the best knowledge there is
        self._stamp(duration_s)

    def _stamp(self, duration_s: float) -> None:
        self._last_pass_at, self._last_pass_s = datetime.now(UTC), round(duration_s, 4)

    def view(self, *, leading: bool) -> PlacementView:
        prefix, placed = self.settings.name_prefix, self._placed
        return PlacementView(
            kind="ray",
            replicas=self.replicas(),
            replicas_from="settings" if self._desired() is None else "api",
            max_replicas=self.settings.max_replicas,
            leading=leading,
            placed=[actor_name(prefix, i) for i in sorted(placed.actors)] if placed else [],
            groups=[group_name(prefix, g) for g in sorted(placed.groups, key=lambda g: g.first)] if placed else [],
            last_pass_at=self._last_pass_at,
            last_pass_s=self._last_pass_s,
            last_error=self._last_error,
        )

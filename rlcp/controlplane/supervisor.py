"""The controller's background loops, started and supervised in one place.

    discovery         member lists from the source, split among the fleets (`fleets.py`)
    status-observer   every member's status, every poll interval          } one of each per fleet,
    reconciler        converge workers that are behind (the leader),      } `:<name>` after a named
                      follow the desired state (a follower)               } fleet's
    lease-elector     acquire / renew the Lease (with leader election only)
    loop-lag          how late the event loop runs (a metric; loopwatch.py)
    placement         keep the placed agents running (placement.kind ray; acts only while leading)

Each loop is a named task. One that dies of an unexpected error is logged and started again
after a short, growing delay: a bug in one pass must not silently end discovery or
reconciliation for the life of the process. `stop` cancels them in reverse order and waits,
so the elector (started first) hands the Lease back only once nothing else mutates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from rlcp.controlplane.controller import Controller
from rlcp.controlplane.discovery.base import DiscoverySource
from rlcp.controlplane.fleet.observer import observe_statuses
from rlcp.controlplane.fleets import Fleets
from rlcp.controlplane.loopwatch import watch_loop_lag
from rlcp.controlplane.reconcile.loop import run_reconciler

log = structlog.get_logger("rlcp.controlplane.supervisor")
Loop = Callable[[], Awaitable[None]]


class Supervisor:
    def __init__(self, *, restart_initial_s: float = 0.5, restart_max_s: float = 30.0) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._initial_s, self._max_s = restart_initial_s, restart_max_s

    def spawn(self, name: str, loop: Loop) -> None:
        self._tasks.append(asyncio.create_task(self._supervise(name, loop), name=name))

    async def _supervise(self, name: str, loop: Loop) -> None:
        delay = self._initial_s
        while True:
            try:
                await loop()
                log.info("background_task_finished", task=name)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background_task_crashed", task=name, restart_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(self._max_s, delay * 2)

    async def stop(self) -> None:
        for task in reversed(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    @property
    def names(self) -> list[str]:
        return [t.get_name() for t in self._tasks if not t.done()]


def start_loops(
    fleets: Fleets, *, source: DiscoverySource, elector: Loop | None = None, background: bool = True
) -> Supervisor:
    """The controller's loops; `background=False` leaves all but the elector to the caller
    (tests drive them step by step)."""
    supervisor = Supervisor()
    if elector is not None:
        supervisor.spawn("lease-elector", elector)
    if background:
        ctl = fleets.default
        supervisor.spawn("discovery", lambda: fleets.follow_discovery(source))
        for each in fleets:
            _spawn_fleet_loops(supervisor, each)
        supervisor.spawn("loop-lag", lambda: watch_loop_lag(ctl.metrics.loop_lag))
        if ctl.placement is not None:
            from rlcp.controlplane.placement.loop import run_placement
            from rlcp.controlplane.placement.ray import RayPlacer

            status = ctl.placement
            placer = RayPlacer(status.settings)  # here, so a missing `ray` fails the start, not a loop
            supervisor.spawn(
                "placement",
                lambda: run_placement(
                    settings=status.settings, is_leader=lambda: ctl.leadership.is_leader, placer=placer, status=status
                ),
            )
    return supervisor


def _spawn_fleet_loops(supervisor: Supervisor, ctl: Controller) -> None:
    s, suffix = ctl.settings, "" if ctl.fleet_settings is None else f":{ctl.fleet}"
    supervisor.spawn(
        f"status-observer{suffix}",
        lambda: observe_statuses(
            registry=ctl.registry,
            fanout=ctl.fanout,
            interval_s=s.reconcile.poll_interval_s,
            deadline_s=ctl.deadlines.control_s,
            seen_refresh_s=s.reconcile.seen_refresh_s,
        ),
    )
    supervisor.spawn(
        f"reconciler{suffix}",
        lambda: run_reconciler(
            reconciler=ctl.reconciler, desired=ctl.desired, leadership=ctl.leadership, interval_s=s.reconcile.interval_s
        ),
    )

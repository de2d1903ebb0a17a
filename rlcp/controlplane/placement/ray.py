"""Placement kind `ray`: the controller as a Ray driver keeping agents as detached actors.

`RayPlacer`'s methods are blocking Ray calls; `run_placement` (loop.py) runs them on one thread
of their own, with a deadline. A pass lists this namespace's named actors and placement groups,
plans (plan.py) and acts: remove what is above `replicas`, add a group for uncovered bundles
and wait until it is reserved, create the missing actors (detached, `max_restarts=-1`, each
scheduled into its bundle). Ray restarts a dead actor on its own; the controller sees that
through discovery (`num_restarts` is the member's incarnation) and converges it before it serves.

The only module of the controller that imports `ray`, and only when placement.kind is ray.

The controller as a Ray driver keeps its own signal handling (`import_ray`): by default `ray.init`
puts abseil's failure-signal handler over the process's SIGTERM handler, and that handler ends
the process 3 s after the first SIGTERM (an `alarm(3)` it arms and never disarms, whose SIGALRM
aborts; or a second SIGTERM that lands on another thread meanwhile, which it re-raises to the
default action after 3 s). A stop that tears the actors down takes longer than that on a busy
machine, and the actors and groups were left behind (issue 33).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import structlog

from rlcp.controlplane.errors import PlacementUnavailable
from rlcp.controlplane.placement.actor import AgentActor
from rlcp.controlplane.placement.plan import (
    Group,
    Placed,
    actor_name,
    after,
    group_name,
    group_of,
    parse_actor,
    parse_group,
    plan_placement,
)
from rlcp.controlplane.settings.placement import RayPlacementSettings

log = structlog.get_logger("rlcp.controlplane.placement")
GROUP_POLL_S = 0.5  # how often a wait for a group's reservation looks whether placement is stopping
# Ray's switch for the failure-signal handler its driver would install (module docstring).
NO_FAILURE_SIGNAL_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


class PassInterrupted(RuntimeError):
    """A pass stopped waiting because placement is stopping (the teardown, if any, comes next)."""


def import_ray() -> Any:
    # Set before Ray reads its constants (at import), and on the constant too in case something in
    # this process imported `ray` first: the driver reads it when `ray.init` starts it.
    os.environ[NO_FAILURE_SIGNAL_HANDLER] = "1"
    try:
        import ray
        import ray._private.ray_constants as ray_constants
    except ImportError as exc:
        raise PlacementUnavailable(
            "placement.kind=ray needs the `ray` package: install the `ray` extra (pip install 'rl-controlplane[ray]')"
        ) from exc
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    return ray  # untyped for us (pyproject: follow_imports skip)


def agent_config(settings: RayPlacementSettings, index: int) -> dict[str, Any]:
    """The agent's settings in actor `index`: the template, its id, free ports, and not ready
    until the controller has told it the desired version (so it never serves stale weights)."""
    config = dict(settings.agent)
    config["agent_id"] = actor_name(settings.name_prefix, index)
    config["admin"] = {**config.get("admin", {}), "port": 0}
    config["inference"] = {**config.get("inference", {}), "port": 0}
    config["require_desired_version"] = True
    return config


class RayPlacer:
    def __init__(self, settings: RayPlacementSettings) -> None:
        self.settings = settings
        self.ray = import_ray()
        self._connected_here = False
        self._stopping = threading.Event()

    def interrupt(self) -> None:
        """From any thread: a pass under way stops at its next wait (`PassInterrupted`), so the
        teardown queued behind it on the placement thread starts at once, not after the pass's
        deadline. Calls after it still run (the teardown is one)."""
        self._stopping.set()

    def connect(self) -> None:
        if self.ray.is_initialized():
            return
        self.ray.init(
            address=self.settings.address,
            namespace=self.settings.namespace,
            logging_level="warning",
            log_to_driver=False,
            configure_logging=False,
        )
        self._connected_here = True
        log.info("placement_connected", address=self.settings.address, namespace=self.settings.namespace)

    def observe(self) -> tuple[set[int], set[Group]]:
        """This namespace's live agent actors (by index) and placement groups."""
        prefix, namespace = self.settings.name_prefix, self.settings.namespace
        actors = set()
        for entry in self.ray.util.list_named_actors(all_namespaces=True):
            if entry.get("namespace") == namespace:
                index = parse_actor(prefix, entry.get("name", ""))
                if index is not None:
                    actors.add(index)
        groups = set()
        for info in self.ray.util.placement_group_table().values():
            if info.get("state") == "REMOVED":
                continue
            group = parse_group(prefix, info.get("name") or "")
            if group is not None and self._in_namespace(info):
                groups.add(group)
        return actors, groups

    def _in_namespace(self, info: dict[str, Any]) -> bool:
        # A group's name is looked up in the driver's namespace; the table lists every namespace.
        try:
            self.ray.util.get_placement_group(info["name"])
        except ValueError:
            return False
        return True

    def reconcile(self, replicas: int) -> Placed:
        """One pass towards `replicas` agents: act on the plan; returns what it did and left."""
        self.connect()
        actors, groups = self.observe()
        plan = plan_placement(replicas, actors, groups)
        if plan.empty:
            return after(plan, actors, groups)
        prefix = self.settings.name_prefix
        for index in plan.kill:
            self._kill(actor_name(prefix, index))
        for group in plan.remove:
            self._remove_group(group)
        kept = groups - set(plan.remove)
        if plan.create_group is not None:
            self._create_group(plan.create_group)
            kept.add(plan.create_group)
        for index in plan.start:
            self._start(index, group_of(index, kept))
        log.info(
            "placement_reconciled",
            replicas=replicas,
            killed=plan.kill,
            started=plan.start,
            removed_groups=[group_name(prefix, g) for g in plan.remove],
            created_group=group_name(prefix, plan.create_group) if plan.create_group else None,
        )
        return after(plan, actors, groups)

    def _kill(self, name: str) -> None:
        try:
            self.ray.kill(self.ray.get_actor(name, namespace=self.settings.namespace), no_restart=True)
        except ValueError:
            pass  # gone already

    def _remove_group(self, group: Group) -> None:
        try:
            self.ray.util.remove_placement_group(
                self.ray.util.get_placement_group(group_name(self.settings.name_prefix, group))
            )
        except ValueError:
            pass

    def _create_group(self, group: Group) -> None:
        b = self.settings.bundle
        bundle = {k: v for k, v in (("CPU", b.CPU), ("GPU", b.GPU)) if v > 0}
        pg = self.ray.util.placement_group(
            [dict(bundle) for _ in range(group.count)],
            strategy=self.settings.strategy,
            name=group_name(self.settings.name_prefix, group),
            lifetime="detached",
        )
        # Reserved, or this pass fails (and the next one finds the group and waits again); in
        # slices, so a stop does not wait behind a group that cannot be reserved.
        ready, deadline = pg.ready(), time.monotonic() + self.settings.call_timeout_s
        while not self.ray.wait([ready], timeout=GROUP_POLL_S)[0]:
            if self._stopping.is_set():
                raise PassInterrupted(
                    f"stopping while waiting for group {group_name(self.settings.name_prefix, group)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"group {group_name(self.settings.name_prefix, group)} not reserved within "
                    f"{self.settings.call_timeout_s:g}s"
                )

    def _start(self, index: int, group: Group) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        b = self.settings.bundle
        pg = self.ray.util.get_placement_group(group_name(self.settings.name_prefix, group))
        cls = self.ray.remote(AgentActor)
        cls.options(
            name=actor_name(self.settings.name_prefix, index),
            namespace=self.settings.namespace,
            lifetime="detached",
            max_restarts=-1,
            max_task_retries=0,
            num_cpus=b.CPU,
            num_gpus=b.GPU,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index - group.first
            ),
        ).remote(agent_config(self.settings, index), self.settings.agent_host, self.settings.agent_start_timeout_s)

    def teardown(self) -> None:
        """Kill every placed actor and remove every group (placement.ray.teardown)."""
        self.connect()
        actors, groups = self.observe()
        for index in sorted(actors):
            self._kill(actor_name(self.settings.name_prefix, index))
        for group in groups:
            self._remove_group(group)
        log.info("placement_torn_down", actors=len(actors), groups=len(groups))

    def close(self) -> None:
        if self._connected_here:
            self.ray.shutdown()
            self._connected_here = False

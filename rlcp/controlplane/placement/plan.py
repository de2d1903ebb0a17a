"""What placement must do to reach `replicas` agents: plain code over names, no Ray.

Ray's placement groups cannot be reshaped, so the bundles come as groups covering ranges of
agent indices: `<prefix>group-<first>-<count>` reserves the bundles of agents first..first+count-1,
agent i taking bundle i-first. Scaling up adds one group for the indices no group covers;
scaling down kills the agents from `replicas` up and removes the groups that start at or above
it (a group that straddles the new count keeps its spare bundles, which a later scale-up
reuses). Everything is recovered from names, so a new leader finds its predecessor's work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Group:
    first: int
    count: int

    def covers(self, index: int) -> bool:
        return self.first <= index < self.first + self.count


@dataclass
class PlacementPlan:
    kill: list[int] = field(default_factory=list)  # actor indices to kill for good
    remove: list[Group] = field(default_factory=list)  # groups to remove
    create_group: Group | None = None  # one new group, for the uncovered indices
    start: list[int] = field(default_factory=list)  # actor indices to create

    @property
    def empty(self) -> bool:
        return not (self.kill or self.remove or self.create_group or self.start)


@dataclass
class Placed:
    """One pass: what it did, and the actors and groups there are after it."""

    plan: PlacementPlan
    actors: set[int]
    groups: set[Group]


def actor_name(prefix: str, index: int) -> str:
    return f"{prefix}{index}"


def group_name(prefix: str, group: Group) -> str:
    return f"{prefix}group-{group.first}-{group.count}"


def parse_actor(prefix: str, name: str) -> int | None:
    m = re.fullmatch(re.escape(prefix) + r"(\d+)", name)
    return int(m.group(1)) if m else None


def parse_group(prefix: str, name: str) -> Group | None:
    m = re.fullmatch(re.escape(prefix) + r"group-(\d+)-(\d+)", name)
    return Group(int(m.group(1)), int(m.group(2))) if m else None


def plan_placement(replicas: int, actors: set[int], groups: set[Group]) -> PlacementPlan:
    plan = PlacementPlan(
        kill=sorted(i for i in actors if i >= replicas),
        remove=sorted((g for g in groups if g.first >= replicas), key=lambda g: g.first),
    )
    kept = groups - set(plan.remove)
    uncovered = [i for i in range(replicas) if not any(g.covers(i) for g in kept)]
    if uncovered:
        plan.create_group = Group(uncovered[0], replicas - uncovered[0])
    plan.start = [i for i in range(replicas) if i not in actors]
    return plan


def after(plan: PlacementPlan, actors: set[int], groups: set[Group]) -> Placed:
    """The actors and groups once `plan` is carried out over what was observed."""
    kept = (groups - set(plan.remove)) | ({plan.create_group} if plan.create_group else set())
    return Placed(plan=plan, actors=(actors - set(plan.kill)) | set(plan.start), groups=kept)


def group_of(index: int, groups: set[Group]) -> Group:
    return next(g for g in sorted(groups, key=lambda g: g.first) if g.covers(index))

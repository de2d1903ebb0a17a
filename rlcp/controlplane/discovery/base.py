"""Discovery: one interface, several sources (static list, HTTP listing, Kubernetes).

A source is an async iterator of complete member lists: it yields whenever the fleet
may have changed (a poll, a watch event). `Membership` turns that stream into
changes: it diffs each list against the last one and bumps `epoch` on every real
change, so a broadcast group formed at epoch N can tell it is stale at N+1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from rlcp.controlplane.workerspec import WorkerSpec


class DiscoverySource(Protocol):
    name: str

    def watch(self) -> AsyncIterator[list[WorkerSpec]]:
        """Yield the complete member list each time it may have changed. Transient
        failures are the source's to retry; it yields nothing until it knows."""


@dataclass(frozen=True)
class MembershipChange:
    epoch: int
    added: tuple[WorkerSpec, ...]
    removed: tuple[WorkerSpec, ...]
    changed: tuple[WorkerSpec, ...]  # same id, new spec (moved, resized)


@dataclass
class Membership:
    epoch: int = 0
    workers: dict[str, WorkerSpec] = field(default_factory=dict)
    synced: bool = False  # the source has reported at least once

    def apply(self, specs: list[WorkerSpec]) -> MembershipChange | None:
        """Replace the member list; returns the change, or None if nothing changed."""
        new = {s.id: s for s in specs}
        first = not self.synced
        self.synced = True
        added = tuple(s for i, s in new.items() if i not in self.workers)
        removed = tuple(s for i, s in self.workers.items() if i not in new)
        changed = tuple(s for i, s in new.items() if i in self.workers and self.workers[i] != s)
        if not (added or removed or changed):
            return MembershipChange(self.epoch, (), (), ()) if first else None
        self.workers = new
        self.epoch += 1
        return MembershipChange(self.epoch, added, removed, changed)

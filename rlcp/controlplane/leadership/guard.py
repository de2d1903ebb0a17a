"""Who leads, as this replica knows it: the one object the elector writes and the API and the
controller read.

It imports nothing from Kubernetes: without leader election the controller holds an
always-leading `Leadership` and behaves exactly as a single controller did. With it, the
elector (`leadership/lease.py`) calls `acquired()` and `lost()`; the API refuses writes while
`is_leader` is false, and every mutation (an API operation, a reconcile pass) runs through
`run_as_leader()`, which cancels it the moment leadership is lost -- a replica that no
longer holds the Lease must not touch a worker again, even halfway through an operation.

`term` counts the times this replica gained leadership, so the controller can tell a new
term (reload the desired state the previous leader may have changed) from the same one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

from rlcp.controlplane.errors import NotLeader

log = structlog.get_logger("rlcp.controlplane.leadership")
T = TypeVar("T")


class Leadership:
    def __init__(self, identity: str, *, leading: bool = False) -> None:
        self.identity = identity
        self._leading = leading
        self.term = 1 if leading else 0
        self.leader_identity: str | None = identity if leading else None
        # Why this replica last stopped leading, as the elector told `lost()` (for example
        # "could not renew within renew_deadline_s=10"); None while it never has. Logged too
        # (`leadership_lost`); kept here so a reader of the object needs no log to know the cause.
        self.lost_reason: str | None = None
        self._guarded: set[asyncio.Task[Any]] = set()
        self._lost_tasks: set[asyncio.Task[Any]] = set()  # cancelled by a loss, not by their caller

    @classmethod
    def always(cls, identity: str) -> Leadership:
        """No election: this replica leads for good."""
        return cls(identity, leading=True)

    @property
    def is_leader(self) -> bool:
        return self._leading

    # -- written by the elector -----------------------------------------------------------------
    def acquired(self) -> None:
        if self._leading:
            return
        self._leading = True
        self.term += 1
        self.leader_identity = self.identity
        log.info("leadership_acquired", identity=self.identity, term=self.term)

    def lost(self, *, leader: str | None, reason: str) -> None:
        """Stop mutating now: every guarded task is cancelled before this returns."""
        self.leader_identity = leader
        if not self._leading:
            return
        self._leading = False
        self.lost_reason = reason
        cancelled = [t for t in self._guarded if not t.done()]
        for task in cancelled:
            self._lost_tasks.add(task)
            task.cancel()
        log.warning(
            "leadership_lost",
            identity=self.identity,
            term=self.term,
            leader=leader,
            reason=reason,
            cancelled=[t.get_name() for t in cancelled],
        )

    def observed(self, leader: str | None) -> None:
        """A follower saw who holds the Lease (None: nobody)."""
        if not self._leading and leader != self.leader_identity:
            self.leader_identity = leader
            log.info("leader_observed", identity=self.identity, leader=leader)

    # -- read by the API and the controller ----------------------------------------------------------
    def refusal(self) -> NotLeader:
        leader = self.leader_identity
        where = f"the leader is {leader!r}" if leader else "no leader is known yet"
        return NotLeader(f"this replica ({self.identity!r}) does not lead; {where}", leader=leader)

    def require(self) -> None:
        if not self._leading:
            raise self.refusal()

    async def run_as_leader(self, coro: Coroutine[Any, Any, T], *, name: str) -> T:
        """Await `coro` as a task that a loss of leadership cancels; that cancellation leaves
        as `NotLeader`. Refused at once (the coroutine never starts) by a follower."""
        if not self._leading:
            coro.close()
            raise self.refusal()
        task = asyncio.create_task(coro, name=name)
        self._guarded.add(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task in self._lost_tasks and not _being_cancelled():
                raise NotLeader(
                    f"leadership was lost while {name} ran; it was stopped ({self.refusal().message})",
                    leader=self.leader_identity,
                ) from None
            task.cancel()  # our caller is being cancelled: take the work down with it
            raise
        finally:
            self._guarded.discard(task)
            self._lost_tasks.discard(task)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

"""The desired fleet state, and the one object that writes it.

Operations state intent (`set_disk_weights`, `set_paused`, `set_lora`, ...); the keeper
applies it to a copy, persists the copy, and only then makes it current, so a store that
refuses a write (a conflict, an unreachable API server) leaves the desired state as it
was. It also loads the state at start-up, follows the leader's writes as a follower, and
reloads it when this replica begins a new leadership term (the previous leader may have
changed it). Readers get `state`, which they must not mutate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.persistence.base import DesiredStore
from rlcp.core.wire.agent.control import PauseMode
from rlcp.core.wire.controller import (
    APPLIED_VERSIONS_KEPT,
    OPERATIONS_KEPT,
    BroadcastSource,
    Checkpoint,
    DesiredState,
    DiskSource,
    LoraSpec,
    OperationResult,
    SleepRecord,
)

log = structlog.get_logger("rlcp.controlplane.fleet.desired")
_RESULTS_KEPT = 32  # per operation kept: the workers that were not ok (a fleet of hundreds stays a small document)


def wanted_pause(desired: DesiredState, worker_id: str) -> PauseMode | None:
    """How this member should be paused, or None for running: the whole fleet's pause, else its
    own hold (a selector-scoped pause)."""
    if desired.paused:
        return desired.pause_mode
    return desired.held.get(worker_id)


def load_source(desired: DesiredState) -> dict[str, str] | None:
    """Where a worker behind gets weights: the desired disk source, else (after a
    broadcast) the newest disk checkpoint known, which may be an older version."""
    if desired.weight_source is not None and desired.weight_source.kind == "disk":
        return {"path": desired.weight_source.path, "version": desired.weight_version or ""}
    if desired.checkpoint is not None:
        return {"path": desired.checkpoint.path, "version": desired.checkpoint.version}
    return None


MINTED_PREFIX = "broadcast-"


def minted_version(desired: DesiredState) -> tuple[str, int]:
    """The name the controller gives weights a broadcast finished without one, and the count it
    makes: `broadcast-<n>`, n one past the names minted so far, skipping a name already applied
    (an operator's own `broadcast-3`, say). Deterministic: the same desired state, the same name."""
    n = desired.minted_versions + 1
    taken = {*desired.applied_versions, desired.weight_version}
    while f"{MINTED_PREFIX}{n}" in taken:
        n += 1
    return f"{MINTED_PREFIX}{n}", n


class DesiredKeeper:
    def __init__(
        self, *, store: DesiredStore, changes: ChangeCounter, on_saved: Callable[[DesiredState], None] | None = None
    ) -> None:
        self._store = store
        self._changes = changes
        self._on_saved = on_saved
        self._state = DesiredState()
        self._term = -1  # the leadership term the state was last loaded in
        self._lock = asyncio.Lock()
        # One write at a time, each applied to what the one before left: an operation's closing
        # write runs after its answer (`run_operation`), and an ungated one (the staleness bound)
        # may come meanwhile; two writes copying the same state would lose one's change.
        self._writing = asyncio.Lock()

    @property
    def state(self) -> DesiredState:
        return self._state

    # -- intents ----------------------------------------------------------------------------
    async def set_disk_weights(self, version: str, source: DiskSource, *, begun: OperationResult | None = None) -> None:
        """Weights loaded from disk: the source is also the newest disk copy known. `begun`: the
        record of the operation that sets them, as running, kept in the same write (an update
        writes once before its first pause, not twice: `Run.begin`)."""

        def change(d: DesiredState) -> None:
            d.weight_version, d.weight_source = version, source
            d.checkpoint = Checkpoint(path=source.path, version=version)
            _applied(d, version)
            if begun is not None:
                _keep_operation(d, begun)

        await self._write(change)

    async def set_broadcast_weights(
        self, version: str | None, checkpoint: Checkpoint | None, *, minted: int | None = None
    ) -> None:
        """Weights every member received over a weight-transfer group; `minted`: the controller
        named them itself (`minted_version`), the count it made."""

        def change(d: DesiredState) -> None:
            d.weight_version, d.weight_source = version, BroadcastSource()
            if minted is not None:
                d.minted_versions = max(d.minted_versions, minted)
            if checkpoint is not None:
                d.checkpoint = checkpoint
            _applied(d, version)

        await self._write(change)

    async def rename_weights(self, version: str) -> None:
        def change(d: DesiredState) -> None:
            d.weight_version = version
            _applied(d, version)

        await self._write(change)

    async def set_staleness_bound(self, bound: int) -> None:
        def change(d: DesiredState) -> None:
            d.staleness_bound = bound

        await self._write(change)

    async def set_placement_replicas(self, replicas: int | None) -> None:
        def change(d: DesiredState) -> None:
            d.placement_replicas = replicas

        await self._write(change)

    async def set_paused(self, paused: bool, mode: PauseMode | None = None) -> None:
        """The whole fleet paused or running: every hold is subsumed (paused) or released (running)."""

        def change(d: DesiredState) -> None:
            d.paused = paused
            d.held = {}
            if mode is not None:
                d.pause_mode = mode

        await self._write(change)

    async def hold(self, worker_ids: list[str], mode: PauseMode) -> None:
        """These members stay paused (a selector-scoped pause) while the rest follow `paused`."""

        def change(d: DesiredState) -> None:
            d.held.update(dict.fromkeys(worker_ids, mode))

        await self._write(change)

    async def release(self, worker_ids: list[str]) -> None:
        def change(d: DesiredState) -> None:
            for worker_id in worker_ids:
                d.held.pop(worker_id, None)

        await self._write(change)

    async def put_to_sleep(self, records: dict[str, SleepRecord]) -> None:
        """These members are kept asleep (out of the fence, left alone by the reconciler but
        for putting them back to sleep) until `wake` releases them."""

        def change(d: DesiredState) -> None:
            d.asleep.update(records)

        await self._write(change)

    async def wake(self, worker_ids: list[str]) -> None:
        """These members woke and passed verification: they follow the fleet again."""

        def change(d: DesiredState) -> None:
            for worker_id in worker_ids:
                d.asleep.pop(worker_id, None)

        await self._write(change)

    async def set_lora(self, name: str, spec: LoraSpec) -> None:
        def change(d: DesiredState) -> None:
            d.loras[name] = spec

        await self._write(change)

    async def drop_lora(self, name: str) -> None:
        def change(d: DesiredState) -> None:
            d.loras.pop(name, None)

        await self._write(change)

    # -- the operations kept beside it --------------------------------------------------------
    async def note_operation(self, op: OperationResult) -> None:
        """An operation begun (status running) or ended: its record replaces the one of the same id."""

        def change(d: DesiredState) -> None:
            _keep_operation(d, op)

        await self._write(change, desired=False)

    async def interrupt_operations(self, why: str) -> list[OperationResult]:
        """The operations kept as running, now `interrupted` (a controller that starts, or
        begins to lead, finds them: whoever ran them stopped); written only if there were any.
        Returns every kept operation, newest first."""
        if not any(o.status == "running" for o in self._state.operations):
            return list(self._state.operations)

        def change(d: DesiredState) -> None:
            d.operations = [
                o.model_copy(update={"status": "interrupted", "detail": o.detail | {"interrupted": why}})
                if o.status == "running"
                else o
                for o in d.operations
            ]

        await self._write(change, desired=False)
        return list(self._state.operations)

    async def _write(self, change: Callable[[DesiredState], None], *, desired: bool = True) -> None:
        """`desired`: the change is one of the desired state (its `updated_at` moves: clients read
        it as when the fleet's target changed); False for the operations kept beside it."""
        async with self._writing:
            await self._write_now(change, desired=desired)

    async def _write_now(self, change: Callable[[DesiredState], None], *, desired: bool) -> None:
        new = _editable(self._state)
        change(new)
        if desired:
            new.updated_at = datetime.now(UTC)
        await self._store.save(new)
        if desired:
            # Stamped again as it becomes current: readers (the gateway's fence first) hold the
            # new target from here, not from before the write (an fsync under load takes tens of
            # ms, during which answers on the old target were still inside the fence). The copy
            # kept has the earlier stamp; the next write stores this one.
            new = new.model_copy(update={"updated_at": datetime.now(UTC)})
        self._state = new
        self._changes.bump()
        if self._on_saved is not None:
            self._on_saved(new)

    # -- loading ------------------------------------------------------------------------------
    async def load(self, *, term: int) -> None:
        self._term = term
        stored = await self._store.load()
        if stored is not None:
            self._replace(stored)
            log.info(
                "desired_state_recovered",
                version=stored.weight_version,
                loras=sorted(stored.loras),
                paused=stored.paused,
            )

    async def reload_for_term(self, term: int) -> bool:
        """Reload once per leadership term; True when this call did."""
        if self._term == term:
            return False
        async with self._lock:
            if self._term == term:
                return False
            await self.load(term=term)
            return True

    async def follow(self, *, leader: str | None) -> None:
        """A follower's view: re-read what the leader wrote, so reads served here are not stale."""
        stored = await self._store.load()
        if stored is not None and stored != self._state:
            self._replace(stored)
            log.info("desired_state_followed", version=stored.weight_version, leader=leader)

    def _replace(self, state: DesiredState) -> None:
        self._state = state
        self._changes.bump()


def _editable(d: DesiredState) -> DesiredState:
    """A copy a change may alter: its containers are its own (a change adds to `held`, drops an
    adapter), the models in them shared with `d` -- a change replaces them, never alters one, and
    readers of `state` must not either. A deep copy took ~0.6 ms of each write, one of them on
    the update's path (the kept operations' records, copied for nothing)."""
    return d.model_copy(
        update={
            "loras": dict(d.loras),
            "held": dict(d.held),
            "asleep": dict(d.asleep),
            "applied_versions": list(d.applied_versions),
            "operations": list(d.operations),
        }
    )


def _keep_operation(d: DesiredState, op: OperationResult) -> None:
    """`op`'s record, newest first, in place of the one of the same id: its failed workers only
    (a fleet of hundreds stays a small document), without its bubble."""
    kept = op.model_copy(
        update={"results": [r for r in op.results if r.status != "ok"][:_RESULTS_KEPT], "bubble": None}
    )
    d.operations = [kept, *(o for o in d.operations if o.id != op.id)][:OPERATIONS_KEPT]


def _applied(d: DesiredState, version: str | None) -> None:
    """Record `version` as the newest applied one (the gateway's staleness bound counts back
    along this list); an unnamed broadcast is not a version the fence can admit."""
    if version is not None and (not d.applied_versions or d.applied_versions[-1] != version):
        d.applied_versions = [*d.applied_versions, version][-APPLIED_VERSIONS_KEPT:]


def admitted_versions(desired: str | None, applied: list[str], bound: int) -> list[str]:
    """The desired version first, then up to `bound` distinct versions applied before it,
    newest first. Empty when nothing is desired (a fleet never updated serves as it is)."""
    if desired is None:
        return []
    out = [desired]
    for version in reversed(applied):
        if len(out) > bound:
            break
        if version not in out:
            out.append(version)
    return out[: bound + 1]

"""`DesiredState.updated_at` is when the new target became current (what the gateway's fence
reads), not when the write began: a client that checks its answers against it (bench.bubble
does) would otherwise count an answer on the old target, routed while the store was still
writing, as outside the fence."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.fleet.desired import DesiredKeeper
from rlcp.controlplane.persistence.memory import MemoryStore
from rlcp.core.wire.controller import DesiredState, DiskSource, OperationResult


class SlowStore(MemoryStore):
    """A store whose write takes 50 ms, as an fsync on a busy disk does; notes when it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.saved_at: datetime | None = None

    async def save(self, desired: DesiredState) -> None:
        await asyncio.sleep(0.05)
        await super().save(desired)
        self.saved_at = datetime.now(UTC)


async def test_the_stamp_is_when_the_target_became_current() -> None:
    store = SlowStore()
    keeper = DesiredKeeper(store=store, changes=ChangeCounter())
    await keeper.set_disk_weights("v1", DiskSource(path="/ckpt/1"))
    assert keeper.state.weight_version == "v1" and store.saved_at is not None
    assert keeper.state.updated_at is not None and keeper.state.updated_at >= store.saved_at
    # The copy written holds the target too (stamped when the write began).
    assert store.saved is not None and store.saved.weight_version == "v1"
    assert store.saved.updated_at is not None and store.saved.updated_at <= keeper.state.updated_at


async def test_a_record_of_an_operation_does_not_move_the_stamp() -> None:
    store = SlowStore()
    keeper = DesiredKeeper(store=store, changes=ChangeCounter())
    await keeper.set_disk_weights("v1", DiskSource(path="/ckpt/1"))
    stamp = keeper.state.updated_at
    op = OperationResult(
        id="op1", kind="update_weights", status="running", started_at=datetime.now(UTC), membership_epoch=1
    )
    await keeper.note_operation(op)
    assert keeper.state.operations[0].id == "op1" and keeper.state.updated_at == stamp
    assert store.saved is not None and store.saved.updated_at == stamp  # and the copy written keeps the later one

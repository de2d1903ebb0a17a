"""An update's record in the desired state's store, off the cycle's path where it can be.

Before its first call to a worker, an update writes the store once: the new desired version
and its record as running, together (a controller killed from there on restarts converging to
that version and lists the update as interrupted). Its ended record is written after the
trainer has its answer: the answer and `GET /v1/rl/operations` show the finished record at
once, the next operation waits for the write (no 409, and its own first write comes after),
and a write the store refuses is logged. The controller's real operations, gate and file store
over real agents (SimEngine) through `MemoryTransport`.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.operations.weights import update_weights
from rlcp.controlplane.persistence.file import FileStore
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.workers.transport import CallPolicy, MemoryTransport, WorkerTransport
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.wire.controller.desired import DesiredState
from rlcp.harness.controller import AUTH, CTL_TOKEN, disk_update, update_body
from rlcp.harness.memory import MemoryFleet
from rlcp.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


class KeptStore(FileStore):
    """The file store, keeping a copy of each document it wrote, in order; its writes can be
    held (`hold`) or refused once (`refuse_next`, as a full disk would)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saved: list[DesiredState] = []
        self.hold: asyncio.Event | None = None
        self.refuse_next = False

    async def save(self, desired: DesiredState) -> None:
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse_next:
            self.refuse_next = False
            raise OSError(28, "No space left on device (injected)")
        await super().save(desired)
        self.saved.append(desired.model_copy(deep=True))


def _settings(memory_fleet: MemoryFleet, tmp_path: Path) -> ControllerSettings:
    return memory_fleet.controller(tmp_path).settings


async def test_an_update_writes_once_before_its_first_call_and_a_restart_there_finds_both(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    store = KeptStore(tmp_path / "state" / "desired.json")
    crashed = tmp_path / "crashed" / "desired.json"
    writes_at_first_call: list[int] = []

    def transports(spec: WorkerSpec, policy: CallPolicy) -> WorkerTransport:
        agent = memory_fleet[spec.id]

        async def handle(method: str, path: str, params: dict[str, str], body: Any) -> tuple[int, Any]:
            # The checkpoint check reads headers only; the first call that changes a worker is
            # where a SIGKILL would leave the store's file as it is now.
            if method == "POST" and path != "/v1/agent/weights/check" and not writes_at_first_call:
                writes_at_first_call.append(len(store.saved))
                crashed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(store.path, crashed)
            return await agent.handle(method, path, params, body)

        return MemoryTransport(worker_id=spec.id, handler=handle, policy=policy)

    settings = _settings(memory_fleet, tmp_path)
    ctl = Controller(settings, transports=transports, store=store)
    ctl.apply_membership(memory_fleet.specs())
    await ctl.refresh()
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    assert result.status == "ok", result
    assert writes_at_first_call == [1]  # one write before anyone was touched, not two
    first = store.saved[0]
    assert first.weight_version == "v1" and [(o.id, o.status) for o in first.operations] == [(result.id, "running")]

    # A controller started on what a kill at the first call left: the version it was going to, and the update
    # listed as interrupted.
    restarted = Controller(settings, transports=memory_fleet.transport, store=FileStore(crashed))
    await restarted.load_desired()
    assert restarted.desired.state.weight_version == "v1"
    assert [(o.id, o.status, o.detail["version"]) for o in restarted.log.recent(5)] == [
        (result.id, "interrupted", "v1")
    ]

    # The update's own controller keeps its end: the write after the answer lands (awaited on stop too).
    await ctl.detached.close()
    assert [(o.id, o.status) for o in store.saved[-1].operations] == [(result.id, "ok")]
    assert len(store.saved) == 2


async def test_the_answer_does_not_wait_for_the_closing_write_and_the_next_operation_does(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    store = KeptStore(tmp_path / "state" / "desired.json")
    settings = _settings(memory_fleet, tmp_path)
    app = assemble(settings, token=CTL_TOKEN, store=store, transports=memory_fleet.transport, background=False)
    async with TestClient(TestServer(app)) as client:
        ctl: Controller = client.server.app[CONTROLLER]
        ctl.apply_membership(memory_fleet.specs())
        await ctl.refresh()

        # The first write (version and record) passes; the closing one is held after it.
        held = asyncio.Event()
        real_save = store.save

        async def hold_the_second(desired: DesiredState) -> None:
            if store.saved:
                store.hold = held
            await real_save(desired)

        store.save = hold_the_second  # type: ignore[method-assign]
        checkpoint = Path(disk_update(tmp_path, "v1", 1).source.path)
        resp = await client.post("/v1/rl/update_weights", json=update_body("v1", checkpoint), headers=AUTH)
        done = await resp.json()
        assert resp.status == 200 and done["status"] == "ok", done
        assert [o.status for o in store.saved[-1].operations] == ["running"]  # the closing write is still held

        listing = await (await client.get("/v1/rl/operations")).json()
        assert [(o["id"], o["status"]) for o in listing["operations"]] == [(done["id"], "ok")]

        # The next operation waits for the write (no 409), and begins only once it landed.
        pausing = asyncio.create_task(client.post("/v1/rl/pause", json={"mode": "keep"}, headers=AUTH))
        await asyncio.sleep(0.2)
        assert not pausing.done() and not any(a.service.paused for a in memory_fleet.agents.values())
        held.set()
        resp = await pausing
        paused = await resp.json()
        assert resp.status == 200 and paused["status"] == "ok", paused
        # In the store: the update ended before the pause began.
        statuses = [[(o.id, o.status) for o in d.operations] for d in store.saved]
        ended = statuses.index([(done["id"], "ok")])
        began = next(i for i, ops in enumerate(statuses) if (paused["id"], "running") in ops)
        assert ended < began and (done["id"], "ok") in statuses[began]


async def test_a_closing_write_the_store_refuses_is_logged_and_the_next_start_lists_it_interrupted(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    store = KeptStore(tmp_path / "state" / "desired.json")
    settings = _settings(memory_fleet, tmp_path)
    ctl = Controller(settings, transports=memory_fleet.transport, store=store)
    ctl.apply_membership(memory_fleet.specs())
    await ctl.refresh()
    real_save = store.save

    async def refuse_the_second(desired: DesiredState) -> None:
        store.refuse_next = len(store.saved) == 1
        await real_save(desired)

    store.save = refuse_the_second  # type: ignore[method-assign]
    with capture_logs() as logs:
        result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
        await wait_for(lambda: ctl.gate.holder is None, what="the closing write over")
    assert result.status == "ok"  # what the operation did stands
    assert [(e["event"], e["log_level"], e["status"]) for e in logs if e["event"] == "operation_end_not_kept"] == [
        ("operation_end_not_kept", "warning", "ok")
    ], logs
    assert "No space left" in next(e["error"] for e in logs if e["event"] == "operation_end_not_kept")
    assert ctl.log.recent(1)[0].status == "ok"  # this process still shows how it ended
    restarted = Controller(settings, transports=memory_fleet.transport, store=FileStore(store.path))
    await restarted.load_desired()
    assert [(o.id, o.status) for o in restarted.log.recent(5)] == [(result.id, "interrupted")]

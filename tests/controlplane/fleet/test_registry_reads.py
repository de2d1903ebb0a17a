"""A status read that was sent before an operation's answer must not undo it when it lands
after: the registry keeps, per worker, since when what it records is known to hold
(`WorkerRecord.known_since`), and drops a read sent earlier (`FleetRegistry.observe`)."""

from __future__ import annotations

import asyncio
import time

from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.fleet.members import FleetRegistry
from rlcp.controlplane.fleet.observer import observe_statuses
from rlcp.controlplane.workers.fanout import Outcome
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus
from rlcp.core.wire.controller.operations import WorkerResult


def status(version: str, *, paused: bool = False) -> WorkerStatus:
    return WorkerStatus(paused=paused, weight_version=version, ready=True, instance_id="a")


def read(wid: str, value: WorkerStatus | None, *, ok: bool = True) -> Outcome[WorkerStatus]:
    result = WorkerResult(
        worker_id=wid, status="ok" if ok else "error", phase="status", message=None if ok else "connection refused"
    )
    return Outcome(wid, result, value)


def registry() -> FleetRegistry:
    reg = FleetRegistry(make_driver=lambda spec: object(), changes=ChangeCounter())
    reg.apply([WorkerSpec(id="w0", admin_url="http://127.0.0.1:9000")])
    reg.observe(read("w0", status("v1")), sent_at=time.monotonic())
    return reg


def test_a_read_sent_before_an_operations_answer_is_dropped_and_a_later_one_applies() -> None:
    reg = registry()
    sent_before = time.monotonic()
    reg.observe(read("w0", status("v2")), reported=True)  # the update's answer: v2, running
    reg.observe(read("w0", status("v1", paused=True)), sent_at=sent_before)  # answered mid-update
    (rec,) = reg.members()
    assert rec.status is not None and (rec.status.weight_version, rec.status.paused) == ("v2", False)
    reg.observe(read("w0", None, ok=False), sent_at=sent_before)  # nor does a stale failure count
    assert rec.reachable
    reg.observe(read("w0", status("v3")), sent_at=time.monotonic())
    assert rec.status.weight_version == "v3"


def test_a_read_sent_before_a_pause_was_answered_cannot_take_the_pause_back() -> None:
    reg = registry()
    sent_before = time.monotonic()
    reg.note_paused("w0", True)  # a stock server's pause answered ok (it answers no status)
    reg.observe(read("w0", status("v1", paused=False)), sent_at=sent_before)
    (rec,) = reg.members()
    assert rec.status is not None and rec.status.paused is True  # the gateway keeps it out


class SlowReads:
    """The observer's fan-out: each read answers `answer` after `delay_s` (a worker busy loading)."""

    def __init__(self, answer: WorkerStatus, delay_s: float) -> None:
        self.answer, self.delay_s, self.sent = answer, delay_s, asyncio.Event()

    async def call(self, driver: object, fn: object, **_: object) -> Outcome[WorkerStatus]:
        self.sent.set()
        await asyncio.sleep(self.delay_s)
        return read("w0", self.answer)


async def test_the_status_poll_in_flight_during_an_update_does_not_undo_the_updates_answer() -> None:
    reg = registry()
    reads = SlowReads(status("v1", paused=True), delay_s=0.2)  # what the worker said mid-update
    observer = asyncio.create_task(
        observe_statuses(registry=reg, fanout=reads, interval_s=0.5, deadline_s=5, iterations=1)  # type: ignore[arg-type]
    )
    await reads.sent.wait()
    reg.observe(read("w0", status("v2")), reported=True)  # the update ends while the read is out
    await observer
    (rec,) = reg.members()
    assert rec.status is not None and (rec.status.weight_version, rec.status.paused) == ("v2", False)

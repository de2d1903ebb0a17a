"""Reading every member's status into the registry: once on demand, and as a loop.

The state endpoint serves what this loop last read; it never fans out per request.
"""

from __future__ import annotations

import asyncio
import time

from rlcp.controlplane.fleet.members import FleetRegistry, WorkerRecord
from rlcp.controlplane.workers.fanout import FanOut, Outcome
from rlcp.controlplane.workerspec import WorkerStatus


async def poll_statuses(
    registry: FleetRegistry, fanout: FanOut, *, deadline_s: float, records: list[WorkerRecord] | None = None
) -> None:
    """Read `records` (default: every member) now, and record what they answered."""
    targets = records if records is not None else registry.members()
    sent = time.monotonic()
    outcomes = await fanout.run(
        [r.driver for r in targets], lambda d: d.status(), phase="status", deadline_s=deadline_s, quiet=True
    )
    for outcome in outcomes:
        registry.observe(outcome, sent_at=sent)


async def observe_statuses(
    *,
    registry: FleetRegistry,
    fanout: FanOut,
    interval_s: float,
    deadline_s: float,
    seen_refresh_s: float = 10.0,
    iterations: int | None = None,
) -> None:
    """Read every member's status every `interval_s`. A read still running at the end of its
    tick is left to finish (its result lands when it does) and its worker is skipped until
    then: a worker that hangs until its deadline delays only its own status, where waiting
    for every read would refresh the whole fleet once per deadline.

    A worker whose status an operation's answer carried within the last interval is not read
    (under update cycles over 1,024 workers the poll was a third of the event loop's work, and
    each worker answers its status twice per update); every `seen_refresh_s` the last_seen
    times of reads that found nothing new are shown in the state document (`publish_seen`)."""
    running: dict[str, asyncio.Task[Outcome[WorkerStatus]]] = {}
    sent: dict[str, float] = {}  # worker id -> when its running read was sent
    published = time.monotonic()
    n = 0
    try:
        while iterations is None or n < iterations:
            n += 1
            tick = time.monotonic()
            if tick - published >= seen_refresh_s:
                registry.publish_seen()
                published = tick
            for rec in registry.members():
                if rec.reported_at is not None and rec.reported_at > tick - interval_s:
                    continue
                if rec.id not in running:
                    sent[rec.id] = time.monotonic()
                    running[rec.id] = asyncio.create_task(
                        fanout.call(
                            rec.driver, lambda d: d.status(), phase="status", deadline_s=deadline_s, quiet=True
                        ),
                        name=f"status-poll:{rec.id}",
                    )
            if running:
                await asyncio.wait(running.values(), timeout=interval_s)
            for worker_id, task in list(running.items()):
                if task.done():
                    del running[worker_id]
                    registry.observe(task.result(), sent_at=sent.pop(worker_id))
            if iterations is not None and n >= iterations:
                break  # the last tick asked for: no sleep after it
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - tick)))
    finally:
        for task in running.values():
            task.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)

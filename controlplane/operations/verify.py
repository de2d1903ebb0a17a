"""Verification after an update: every updated worker reports the version, and where its
driver can compute them, weight checksums agree; a minority that disagrees fails."""

from __future__ import annotations

import hashlib
import json
from collections import Counter as Tally

from controlplane.fleet.registry import WorkerRecord
from controlplane.operations.context import Run
from controlplane.workers.capabilities import Driver, has
from controlplane.workers.transport import WorkerRejected


async def verify(run: Run, records: list[WorkerRecord], version: str) -> list[WorkerRecord]:
    """The records that passed; failures are recorded in the run."""
    deadlines = run.ctx.deadlines

    async def reports_version(driver: Driver) -> None:
        status = await driver.status()
        if status.weight_version != version:
            raise WorkerRejected(driver.spec.id, f"reports weight version {status.weight_version!r}, "
                                                 f"expected {version!r}")

    at_version = await run.step("verifying", "verify", records, reports_version, deadlines.control_s)
    hashing = [r for r in at_version if has(r.driver, "checksums")]
    outcomes = await run.ctx.fanout.run([r.driver for r in hashing], lambda d: d.weight_checksums(),
                                        phase="verify", deadline_s=deadlines.checksums_s)
    digests = {o.worker_id: _digest(o.value) for o in outcomes if o.ok and o.value}
    run.tracker.record(o for o in outcomes if not o.ok)
    failed = {o.worker_id for o in outcomes if not o.ok}
    if digests:
        majority, count = Tally(digests.values()).most_common(1)[0]
        for worker_id, digest in digests.items():
            if digest != majority:
                failed.add(worker_id)
                run.tracker.set_result(run.tracker.results[worker_id].model_copy(update={
                    "status": "error", "phase": "verify",
                    "message": f"weight checksums differ from {count} other worker(s) at version {version!r}"}))
    return [r for r in at_version if r.id not in failed]


def _digest(checksums: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()

"""Verification after an update: every updated worker reports the version, and where its
driver can compute them, weight checksums agree; a minority that disagrees fails. A worker
whose load answered its version and checksums (`LoadReport`) is judged on that answer,
without another call."""

from __future__ import annotations

import hashlib
import json
from collections import Counter as Tally

from controlplane.fleet.registry import WorkerRecord
from controlplane.operations.context import Run
from controlplane.workers.capabilities import Driver, LoadReport, has
from controlplane.workers.transport import WorkerRejected


async def verify(run: Run, records: list[WorkerRecord], version: str,
                 reports: dict[str, LoadReport] | None = None) -> list[WorkerRecord]:
    """The records that passed; failures are recorded in the run."""
    deadlines = run.ctx.deadlines
    reports = reports or {}

    async def reports_version(driver: Driver) -> None:
        report = reports.get(driver.spec.id)
        reported = report.weight_version if report is not None else (await driver.status()).weight_version
        if reported != version:
            raise WorkerRejected(driver.spec.id, f"reports weight version {reported!r}, expected {version!r}")

    at_version = await run.step("verifying", "verify", records, reports_version, deadlines.control_s)
    hashing = [r for r in at_version if has(r.driver, "checksums") and r.id not in reports]
    outcomes = await run.ctx.fanout.run([r.driver for r in hashing], lambda d: d.weight_checksums(),
                                        phase="verify", deadline_s=deadlines.checksums_s)
    digests = {o.worker_id: _digest(o.value) for o in outcomes if o.ok and o.value}
    digests |= {r.id: _digest(reports[r.id].checksums) for r in at_version  # type: ignore[arg-type]
                if r.id in reports and reports[r.id].checksums}
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

"""Verification after an update: every updated worker reports the version, and where its
driver can compute them, weight checksums agree; a minority that disagrees fails. A worker
whose load answered its version and checksums (`LoadReport`) is judged on that answer,
without another call.

Agreement among workers cannot catch a majority that loaded the same wrong files, so:
- a trainer's manifest of the version's checksums (`expected_checksums`) is checked on every
  worker, tensor by tensor; only the tensors it does not name (an adapter's, say) are left
  to the comparison between workers;
- a rolling update's later waves are held to what the earlier ones agreed on (`Agreement`),
  not only to each other: a wave of one would otherwise agree with itself.

A tensor whose checksum is of no bytes on any worker (`EMPTY_TENSOR_SHA256`: a stock `vllm
serve` on the CPU empties its linear layers' parameters when it repacks them for its kernels)
tells nothing: it is left out of every comparison, for every worker, and the operation's detail
says so (`checksums_not_compared`) instead of counting it as agreement. A worker whose checksums
differ is told which tensors differ from the ones it was held to.

An adapter loaded fleet-wide is verified the same way (`verify_adapter`): its tensors, as the
workers hold them, agree across the workers whose checksums cover adapters (the agent's keys
`lora:<name>:...`; stock vLLM's checksums leave adapters out, so those are not judged).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter as Tally
from dataclasses import dataclass

from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.operations.context import Run
from rlcp.controlplane.workers.capabilities import CHECKSUMS, DRIVER, Driver, LoadReport, capable, has
from rlcp.controlplane.workers.transport import WorkerRejected
from rlcp.core.wire.agent import EMPTY_TENSOR_SHA256, checksums_disagree, lora_checksum_key

_NAMED = 3  # tensors named in a mismatch message


@dataclass
class Agreement:
    """The checksums earlier waves of one update agreed on, as one of their workers gave them
    (None before the first)."""

    checksums: dict[str, str] | None = None


async def verify(
    run: Run,
    records: list[WorkerRecord],
    version: str,
    reports: dict[str, LoadReport] | None = None,
    *,
    manifest: dict[str, str] | None = None,
    agreement: Agreement | None = None,
) -> list[WorkerRecord]:
    """The records that passed; failures are recorded in the run."""
    deadlines = run.ctx.deadlines
    reports = reports or {}

    async def reports_version(driver: Driver) -> None:
        report = reports.get(driver.spec.id)
        reported = report.weight_version if report is not None else (await driver.status()).weight_version
        if reported != version:
            raise WorkerRejected(driver.spec.id, f"reports weight version {reported!r}, expected {version!r}")

    at_version = await run.step("verifying", "verify", records, DRIVER, reports_version, deadlines.control_s)
    hashing = [r for r in at_version if has(r.driver, "checksums") and r.id not in reports]
    outcomes = await run.ctx.fanout.each(
        [r.driver for r in hashing],
        CHECKSUMS,
        lambda w: w.weight_checksums(),
        phase="verify",
        deadline_s=deadlines.checksums_s,
    )
    run.tracker.record(o for o in outcomes if not o.ok)
    failed = {o.worker_id for o in outcomes if not o.ok}
    checksums = {o.worker_id: o.value for o in outcomes if o.ok and o.value}
    checksums |= {
        r.id: report.checksums for r in at_version if (report := reports.get(r.id)) is not None and report.checksums
    }

    def fail(worker_id: str, message: str) -> None:
        failed.add(worker_id)
        run.tracker.set_result(
            run.tracker.results[worker_id].model_copy(
                update={"status": "error", "phase": "verify", "message": message, "code": "verify_failed"}
            )
        )

    if manifest:
        for worker_id, sums in checksums.items():
            if problem := checksums_disagree(sums, manifest, named=_NAMED):
                fail(worker_id, f"weight checksums differ from the manifest of version {version!r}: {problem}")
        for r in at_version:
            if r.id not in checksums and r.id not in failed:
                fail(r.id, "gave no weight checksums to check against the manifest")
    pool = {wid: sums for wid, sums in checksums.items() if wid not in failed}
    reference = agreement.checksums if agreement is not None else None
    uncovered = _not_compared(
        run, [*pool.values(), *([reference] if reference else []), *([manifest] if manifest else [])]
    )

    def compared(sums: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in sums.items() if k not in uncovered and not (manifest and k in manifest)}

    digests = {wid: checksums_digest(compared(sums)) for wid, sums in pool.items()}
    if digests:
        if reference is not None:
            agreed_sums = reference
            why = f"weight checksums differ from those the earlier waves agreed on at version {version!r}"
        else:
            majority, count = _majority(digests)
            agreed_sums = next(pool[wid] for wid, digest in digests.items() if digest == majority)
            why = f"weight checksums differ from {count} other worker(s) at version {version!r}"
        agreed = checksums_digest(compared(agreed_sums))
        for worker_id, digest in digests.items():
            if digest != agreed:
                fail(worker_id, f"{why}: {_differing(compared(pool[worker_id]), compared(agreed_sums))}")
        if agreement is not None and agreement.checksums is None:
            agreement.checksums = agreed_sums
    return [r for r in at_version if r.id not in failed]


def _not_compared(run: Run, sums: list[dict[str, str]]) -> set[str]:
    """The tensors some worker hashed as no bytes: noted in the operation's detail, and compared nowhere."""
    empty = {k for one in sums for k, v in one.items() if v == EMPTY_TENSOR_SHA256}
    if empty:
        noted = set(run.tracker.detail.get("checksums_not_compared", {}).get("tensors", []))  # earlier waves'
        run.tracker.note(
            checksums_not_compared={
                "tensors": sorted(noted | empty),
                "why": "a checksum of no bytes (sha256 of b''), such as a stock vLLM server's on the CPU for the "
                "linear layers it repacks into its kernels",
            }
        )
    return empty


def _differing(sums: dict[str, str], agreed: dict[str, str]) -> str:
    differ = sorted(k for k in sums.keys() | agreed.keys() if sums.get(k) != agreed.get(k))
    return f"{len(differ)} tensor(s) differ ({', '.join(differ[:_NAMED])}{', ...' if len(differ) > _NAMED else ''})"


async def verify_adapter(
    run: Run, records: list[WorkerRecord], name: str, held: dict[str, dict[str, str]] | None = None
) -> list[WorkerRecord]:
    """The records whose copy of adapter `name` agrees with the majority's (or that cannot
    say: no checksums, or none covering adapters); failures are recorded in the run. `held`:
    the adapter's checksums some loads answered, by worker id; the others whose checksums cover
    adapters are asked."""
    prefix = lora_checksum_key(name, "")
    held = dict(held or {})
    run.ctx.log.set_phase("verifying")
    hashing = [
        r
        for r in records
        if r.id not in held
        and has(r.driver, "checksums")
        and any(d.covers_adapters for d in capable([r.driver], CHECKSUMS))
    ]
    outcomes = await run.ctx.fanout.each(
        [r.driver for r in hashing],
        CHECKSUMS,
        lambda w: w.weight_checksums(),
        phase="verify",
        deadline_s=run.ctx.deadlines.checksums_s,
    )
    run.tracker.record(o for o in outcomes if not o.ok)
    failed = {o.worker_id for o in outcomes if not o.ok}
    held |= {o.worker_id: {k: v for k, v in (o.value or {}).items() if k.startswith(prefix)} for o in outcomes if o.ok}
    digests = {worker_id: checksums_digest(sums) for worker_id, sums in held.items() if sums}
    if digests:
        majority, count = _majority(digests)
        for worker_id, digest in digests.items():
            if digest != majority:
                failed.add(worker_id)
                run.tracker.set_result(
                    run.tracker.results[worker_id].model_copy(
                        update={
                            "status": "error",
                            "phase": "verify",
                            "code": "verify_failed",
                            "message": f"adapter {name!r} checksums differ from {count} other worker(s)",
                        }
                    )
                )
    return [r for r in records if r.id not in failed]


def _majority(digests: dict[str, str]) -> tuple[str, int]:
    """The digest most workers gave, and how many gave it."""
    return Tally(digests.values()).most_common(1)[0]


def checksums_digest(checksums: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()

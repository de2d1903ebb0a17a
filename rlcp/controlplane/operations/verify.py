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

A member woken from sleep is checked too (`check_woken`, for `sleep.py`): awake, at the version
expected, and with the weights it slept with where it is at that version again.

An adapter loaded fleet-wide is verified the same way (`verify_adapter`): its tensors, as the
workers hold them, agree across the workers whose checksums cover adapters (the agent's keys
`lora:<name>:...`; stock vLLM's checksums leave adapters out, so those are not judged).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter as Tally
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.controlplane.operations.context import Run
from rlcp.controlplane.operations.steps import StepDone
from rlcp.controlplane.operations.transaction import Call, Effect
from rlcp.controlplane.workers.capabilities import (
    CHECKSUMS,
    DRIVER,
    Checksums,
    Driver,
    LoadReport,
    capable,
    has,
    implements,
)
from rlcp.controlplane.workers.steps import Step
from rlcp.controlplane.workers.transport import WorkerRejected
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent.checksums import EMPTY_TENSOR_SHA256, checksums_disagree, lora_checksum_key
from rlcp.core.wire.controller import SleepRecord

_NAMED = 3  # tensors named in a mismatch message


@dataclass
class Agreement:
    """The checksums earlier waves of one update agreed on, as one of their workers gave them
    (None before the first)."""

    checksums: dict[str, str] | None = None


@dataclass(frozen=True)
class Verdict:
    """What the checksums of one verification decided: the workers that failed and why, the
    checksums they were held to (None: nothing was compared), and the tensors left out of
    every comparison (hashed as no bytes somewhere)."""

    failed: dict[str, str]
    agreed: dict[str, str] | None
    not_compared: frozenset[str]


def verify(
    run: Run,
    records: list[WorkerRecord],
    version: str,
    reports: dict[str, LoadReport] | None = None,
    *,
    manifest: dict[str, str] | None = None,
    agreement: Agreement | None = None,
) -> Generator[Effect, Any, list[WorkerRecord]]:
    """The records that passed; failures are recorded in the run. Two steps at most (the
    version, where no load answered it; the checksums, where none did), then `judge`."""
    deadlines = run.ctx.deadlines
    reports = reports or {}

    async def reports_version(driver: Driver) -> None:
        report = reports.get(driver.spec.id)
        reported = report.weight_version if report is not None else (await driver.status()).weight_version
        if reported != version:
            raise WorkerRejected(driver.spec.id, f"reports weight version {reported!r}, expected {version!r}")

    read: StepDone[None] = yield Call(
        Step(name="verify", can=DRIVER, call=reports_version, deadline_s=deadlines.control_s), records
    )
    at_version = read.ok
    hashing = [r for r in at_version if has(r.driver, "checksums") and r.id not in reports]
    hashed: StepDone[dict[str, str] | None] = yield Call(_hash_step(deadlines.checksums_s), hashing)
    checksums = {worker_id: sums for worker_id, sums in hashed.answers.items() if sums}
    checksums |= {
        r.id: report.checksums for r in at_version if (report := reports.get(r.id)) is not None and report.checksums
    }
    unhashed = {r.id for r in hashing} - {r.id for r in hashed.ok}
    verdict = judge(
        checksums,
        version,
        without=[r.id for r in at_version if r.id not in checksums and r.id not in unhashed],
        manifest=manifest,
        reference=agreement.checksums if agreement is not None else None,
    )
    _note_not_compared(run, verdict.not_compared)
    for worker_id, why in verdict.failed.items():
        run.steps.fail(worker_id, phase="verify", code="verify_failed", message=why)
    if agreement is not None and agreement.checksums is None and verdict.agreed is not None:
        agreement.checksums = verdict.agreed
    return [r for r in at_version if r.id not in verdict.failed and r.id not in unhashed]


def _hash_step(deadline_s: float) -> Step[Checksums, dict[str, str] | None]:
    return Step(name="verify", can=CHECKSUMS, call=lambda w: w.weight_checksums(), deadline_s=deadline_s)


def judge(
    checksums: dict[str, dict[str, str]],
    version: str,
    *,
    without: list[str],
    manifest: dict[str, str] | None = None,
    reference: dict[str, str] | None = None,
) -> Verdict:
    """Which workers' checksums fail, pure: against the manifest (tensor by tensor; a worker
    in `without` gave none to check), then what is left against the earlier waves' agreement
    (`reference`), else the majority's. The manifest's tensors and those hashed as no bytes are
    left out of the comparison between workers."""
    failed: dict[str, str] = {}
    if manifest:
        for worker_id, sums in checksums.items():
            if problem := checksums_disagree(sums, manifest, named=_NAMED):
                failed[worker_id] = f"weight checksums differ from the manifest of version {version!r}: {problem}"
        for worker_id in without:
            failed.setdefault(worker_id, "gave no weight checksums to check against the manifest")
    pool = {wid: sums for wid, sums in checksums.items() if wid not in failed}
    sources = [*pool.values(), *([reference] if reference else []), *([manifest] if manifest else [])]
    uncovered = frozenset(k for one in sources for k, v in one.items() if v == EMPTY_TENSOR_SHA256)

    def compared(sums: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in sums.items() if k not in uncovered and not (manifest and k in manifest)}

    digests = {wid: checksums_digest(compared(sums)) for wid, sums in pool.items()}
    if not digests:
        return Verdict(failed, None, uncovered)
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
            failed[worker_id] = f"{why}: {_differing(compared(pool[worker_id]), compared(agreed_sums))}"
    return Verdict(failed, agreed_sums, uncovered)


def _note_not_compared(run: Run, empty: frozenset[str]) -> None:
    """The tensors some worker hashed as no bytes, noted in the operation's detail (with the
    earlier waves')."""
    if empty:
        noted = set(run.tracker.detail.get("checksums_not_compared", {}).get("tensors", []))  # earlier waves'
        run.tracker.note(
            checksums_not_compared={
                "tensors": sorted(noted | empty),
                "why": "a checksum of no bytes (sha256 of b''), such as a stock vLLM server's on the CPU for the "
                "linear layers it repacks into its kernels",
            }
        )


def _differing(sums: dict[str, str], agreed: dict[str, str]) -> str:
    differ = sorted(k for k in sums.keys() | agreed.keys() if sums.get(k) != agreed.get(k))
    return f"{len(differ)} tensor(s) differ ({', '.join(differ[:_NAMED])}{', ...' if len(differ) > _NAMED else ''})"


def verify_adapter(
    run: Run, records: list[WorkerRecord], name: str, held: dict[str, dict[str, str]] | None = None
) -> Generator[Effect, Any, list[WorkerRecord]]:
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
    hashed: StepDone[dict[str, str] | None] = yield Call(_hash_step(run.ctx.deadlines.checksums_s), hashing)
    unhashed = {r.id for r in hashing} - {r.id for r in hashed.ok}
    held |= {
        worker_id: {k: v for k, v in (sums or {}).items() if k.startswith(prefix)}
        for worker_id, sums in hashed.answers.items()
    }
    failed = judge_adapter(held, name)
    for worker_id, why in failed.items():
        run.steps.fail(worker_id, phase="verify", code="verify_failed", message=why)
    return [r for r in records if r.id not in failed and r.id not in unhashed]


def judge_adapter(held: dict[str, dict[str, str]], name: str) -> dict[str, str]:
    """The workers whose copy of adapter `name` differs from the majority's, and why (pure);
    a worker with no checksums of it is not judged."""
    digests = {worker_id: checksums_digest(sums) for worker_id, sums in held.items() if sums}
    if not digests:
        return {}
    majority, count = _majority(digests)
    return {
        worker_id: f"adapter {name!r} checksums differ from {count} other worker(s)"
        for worker_id, digest in digests.items()
        if digest != majority
    }


def _majority(digests: dict[str, str]) -> tuple[str, int]:
    """The digest most workers gave, and how many gave it."""
    return Tally(digests.values()).most_common(1)[0]


def checksums_digest(checksums: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()


async def check_woken(
    driver: Driver, status: WorkerStatus | None, record: SleepRecord | None, desired_version: str | None
) -> None:
    """Raise `WorkerRejected` unless a woken member is awake at the expected version and, at the
    version it slept with, holds the weights it slept with."""
    worker_id = driver.spec.id
    if status is None:
        raise WorkerRejected(worker_id, "answered no status", status=200)
    _check_awake(worker_id, status, expected_version(desired_version, record))
    # At the version it slept with (reloaded after level 2 too: the same checkpoint gives
    # the same tensors), its weights must be the ones it slept with.
    if (
        record is None
        or record.checksums_digest is None
        or status.weight_version != record.weight_version
        or not (has(driver, "checksums") and implements(driver, CHECKSUMS))
    ):
        return
    sums = await driver.weight_checksums()
    if sums is not None and checksums_digest(sums) != record.checksums_digest:
        raise WorkerRejected(
            worker_id,
            f"weight checksums differ from those it had when it went to sleep (version {record.weight_version!r})",
            status=200,
        )


def expected_version(desired: str | None, record: SleepRecord | None) -> str | None:
    """What a woken member must report: the fleet's desired version, else (nothing desired
    yet) the one it slept with; None: nothing to hold it to."""
    if desired is not None:
        return desired
    return record.weight_version if record is not None else None


def _check_awake(worker_id: str, status: WorkerStatus, version: str | None) -> None:
    if status.engine_alive is False:
        raise WorkerRejected(worker_id, "its engine is not alive after the wake", status=200)
    if status.sleeping:
        raise WorkerRejected(worker_id, "still reports itself asleep after a full wake", status=200)
    if version is not None and status.weight_version != version:
        raise WorkerRejected(
            worker_id, f"reports weight version {status.weight_version!r}, expected {version!r}", status=200
        )

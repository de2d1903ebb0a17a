"""Fan-out: one call to many workers, bounded, each with its own deadline.

Every call yields a `WorkerResult` (ok / error / timeout, duration, message) and never
raises: one slow or dead worker costs its own deadline and nothing else, since the
calls run concurrently and the semaphore only bounds how many are in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from rlcp.controlplane.workers.capabilities import Can, Driver, implements
from rlcp.controlplane.workers.transport import WorkerCallError, WorkerRejected, WorkerTimeout
from rlcp.core.wire.controller.operations import ResultStatus, WorkerResult

log = structlog.get_logger("rlcp.controlplane.workers.fanout")
T = TypeVar("T")
D = TypeVar("D", bound=Driver)
P = TypeVar("P", bound=Driver)


@dataclass
class Outcome(Generic[T]):
    worker_id: str
    result: WorkerResult
    value: T | None = None
    refused_with: int | None = None  # the HTTP status the worker refused the call with, if it did

    @property
    def ok(self) -> bool:
        return self.result.status == "ok"


class FanOut:
    def __init__(self, max_concurrency: int) -> None:
        self._slots = asyncio.Semaphore(max_concurrency)

    async def call(
        self, driver: D, fn: Callable[[D], Awaitable[T]], *, phase: str, deadline_s: float, quiet: bool = False
    ) -> Outcome[T]:
        """`quiet`: do not log a failure (status polls log reachability changes instead)."""
        worker_id = driver.spec.id
        async with self._slots:
            # The deadline starts once a slot is ours: queueing behind a bound is not the worker's fault.
            t0 = time.perf_counter()
            value: T | None = None
            status: ResultStatus = "ok"
            message: str | None = None
            code: str | None = None
            refused_with: int | None = None
            try:
                async with asyncio.timeout(deadline_s):
                    value = await fn(driver)
            except TimeoutError:
                status, message, code = "timeout", f"{phase} did not finish within {deadline_s:g}s", "timeout"
            except WorkerTimeout as exc:
                status, message, code = "timeout", exc.reason, exc.code
            except WorkerCallError as exc:
                status, message, code = "error", exc.reason, exc.code
                if isinstance(exc, WorkerRejected):
                    refused_with = exc.status
            except Exception as exc:  # a flavor bug must not sink the other workers' results
                log.exception("fanout_call_crashed", worker_id=worker_id, phase=phase)
                status, message, code = "error", f"{type(exc).__name__}: {exc}", "internal"
        duration = round(time.perf_counter() - t0, 6)
        if status != "ok" and not quiet:
            log.warning("worker_call_failed", worker_id=worker_id, phase=phase, status=status, code=code, error=message)
        return Outcome(
            worker_id,
            WorkerResult(
                worker_id=worker_id, status=status, phase=phase, duration_s=duration, message=message, code=code
            ),
            value,
            refused_with,
        )

    async def run(
        self,
        drivers: Sequence[D],
        fn: Callable[[D], Awaitable[T]],
        *,
        phase: str,
        deadline_s: float,
        quiet: bool = False,
    ) -> list[Outcome[T]]:
        return list(
            await asyncio.gather(*(self.call(d, fn, phase=phase, deadline_s=deadline_s, quiet=quiet) for d in drivers))
        )

    async def each(
        self,
        drivers: Sequence[Driver],
        can: Can[P],
        fn: Callable[[P], Awaitable[T]],
        *,
        phase: str,
        deadline_s: float,
        quiet: bool = False,
    ) -> list[Outcome[T]]:
        """`run` over the drivers that implement `can`, `fn` typed over its Protocol; a driver
        that does not is sent nothing and fails at once, naming what it lacks (operations
        refuse such a member up front: this is the member that joined since)."""
        able = [d for d in drivers if implements(d, can)]
        outcomes = await self.run(able, fn, phase=phase, deadline_s=deadline_s, quiet=quiet)
        if len(able) < len(drivers):
            outcomes += [
                Outcome(
                    d.spec.id,
                    WorkerResult(
                        worker_id=d.spec.id,
                        status="error",
                        phase=phase,
                        code="capability_missing",
                        message=f"{d.spec.id} ({d.spec.flavor}) lacks the {can.name!r} capability",
                    ),
                )
                for d in drivers
                if not implements(d, can)
            ]
        return outcomes

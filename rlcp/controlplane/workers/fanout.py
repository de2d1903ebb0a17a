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
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_fixed

from rlcp.controlplane.workers.capabilities import Can, Driver, implements
from rlcp.controlplane.workers.transport import WorkerCallError, WorkerRejected, WorkerTimeout
from rlcp.core import deadline
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


@dataclass(frozen=True, kw_only=True)
class Retry:
    """Call a worker again while it fails with one of `codes` (what it answered: the failure
    may pass), every `wait_s`, for at most `within_s`; its last failure is its result.

    Its last *answer*, that is: an attempt that gets no answer (the step's deadline cut it,
    the worker stopped answering) after the worker said one of `codes` leaves what the worker
    said as its result (`Retried.settle`). A loop stalled past the step's deadline while the
    worker was saying "not there" must not turn that into "no evidence either way"."""

    codes: frozenset[str]
    wait_s: float
    within_s: float

    def around(self, call: Callable[[P], Awaitable[T]]) -> Retried[P, T]:
        return Retried(self, call)


class Retried(Generic[P, T]):
    """One step's call with its `Retry`, over the workers of one fan-out: the call as sent
    (`__call__`), and each worker's last answer among the retry's codes."""

    def __init__(self, retry: Retry, call: Callable[[P], Awaitable[T]]) -> None:
        self._retry, self._call = retry, call
        self._said: dict[str, WorkerCallError] = {}

    async def __call__(self, driver: P) -> T:
        codes = self._retry.codes

        def passing(exc: BaseException) -> bool:
            return isinstance(exc, WorkerCallError) and exc.code in codes

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(passing),
            wait=wait_fixed(self._retry.wait_s),
            stop=stop_after_delay(self._retry.within_s),
            reraise=True,
        ):
            with attempt:
                try:
                    return await self._call(driver)
                except WorkerCallError as exc:
                    if exc.code in codes:
                        self._said[driver.spec.id] = exc
                    raise
        raise AssertionError("unreachable: tenacity reraises the last failure")

    def settle(self, outcome: Outcome[T]) -> Outcome[T]:
        """`outcome`, or, where it is no answer after the worker answered one of the codes,
        that answer (its message saying what came after)."""
        said = self._said.get(outcome.worker_id)
        if outcome.ok or said is None or outcome.result.code in self._retry.codes:
            return outcome
        result = outcome.result.model_copy(
            update={
                "status": "error",
                "code": said.code,
                "message": f"{said.reason} (then: {outcome.result.message})",
            }
        )
        return Outcome(outcome.worker_id, result)


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
                async with deadline.timeout(deadline_s):  # not counting time this process's loop was held
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

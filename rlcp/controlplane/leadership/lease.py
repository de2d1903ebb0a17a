"""Leader election on a coordination.k8s.io/v1 Lease, by client-go's algorithm.

    run()                  acquire (retry every retry_period) -> lead -> renew until lost -> again
    try_acquire_or_renew() one read-modify-replace of the Lease, guarded by its resourceVersion

Why it is safe:
- Writes are optimistic: the replace carries the resourceVersion we read, so of two replicas
  racing for an expired Lease one gets 409 and simply tries again next period.
- A follower judges expiry by its own clock: a Lease counts as held until `leaseDurationSeconds`
  have passed since this replica last *saw the record change*, never by comparing the holder's
  `renewTime` with our clock (the clocks of two nodes need not agree).
- The leader steps down when it has not renewed for `renew_deadline_s`, counted from the moment
  it *sent* the last successful renewal; others wait `lease_duration_s` from the moment they
  *read* it, which is later. With renew_deadline < lease_duration the old leader has stopped
  before anyone else can start. Every renewal runs under that deadline, so a hung API call
  cannot keep a stale leader mutating.
- On shutdown the leader releases the Lease (empty holder), so a successor need not wait.

Every "how long since" above is read from one clock, the event loop's unless `clock` is given (a
test seam: a clock the test moves makes "the renew deadline has passed" an event the test causes,
instead of a race against how fast the machine runs).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import structlog
from kubernetes_asyncio import client

from rlcp.controlplane.k8s.client import K8sConflict, K8sError, K8sNotFound, call
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.settings.leader_election import LeaderElectionSettings

log = structlog.get_logger("rlcp.controlplane.leadership.lease")
Attempt = Literal["held", "other", "failed"]  # we hold it / someone else validly does / could not tell


def micro_time(dt: datetime) -> str:
    """The API's MicroTime: RFC 3339 with exactly six fractional digits (isoformat drops them at .0)."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    duration_s: int
    # datetimes as the client reads them (a string where it cannot: no dateutil), None when unset
    acquire_time: datetime | str | None
    renew_time: datetime | str | None
    transitions: int

    @classmethod
    def of(cls, lease: client.V1Lease) -> LeaseRecord:
        spec = lease.spec or client.V1LeaseSpec()
        return cls(
            holder=spec.holder_identity or None,
            duration_s=int(spec.lease_duration_seconds or 0),
            acquire_time=spec.acquire_time,
            renew_time=spec.renew_time,
            transitions=int(spec.lease_transitions or 0),
        )


class LeaseElector:
    def __init__(
        self,
        *,
        api: client.ApiClient,
        settings: LeaderElectionSettings,
        leadership: Leadership,
        request_timeout_s: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._coord = client.CoordinationV1Api(api)
        self._s = settings
        self.leadership = leadership
        self._timeout_s = request_timeout_s
        # The time the deadlines and expiries are judged by (seconds, monotonic); see the module doc.
        self._clock = clock or asyncio.get_running_loop().time
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # clock time at which the record last changed, as we saw it
        self._renewed_at = 0.0  # clock time at which the last successful write was sent
        self._what = f"Lease {settings.namespace}/{settings.lease_name}"
        self._log = log.bind(lease=f"{settings.namespace}/{settings.lease_name}", identity=settings.identity)

    # -- the loop -----------------------------------------------------------------------------------
    async def run(self, *, terms: int | None = None) -> None:
        """Acquire, lead, lose, and again; `terms` (a test seam) stops after that many terms."""
        done = 0
        try:
            while terms is None or done < terms:
                await self._acquire()
                self.leadership.acquired()
                reason = await self._renew_until_lost()
                holder = self._observed.holder if self._observed else None
                self.leadership.lost(leader=holder if holder != self._s.identity else None, reason=reason)
                done += 1
        finally:
            if self.leadership.is_leader:
                # Cancelled (shutdown) while leading: stop mutating first, then hand the Lease back.
                self.leadership.lost(leader=None, reason="shutting down")
                await self._release()

    async def _acquire(self) -> None:
        while True:
            if await self._attempt(self._timeout_s) == "held":
                return
            # Jitter, so replicas that start together do not keep colliding (client-go: 1.2x).
            await asyncio.sleep(self._s.retry_period_s * random.uniform(1.0, 1.2))

    async def _renew_until_lost(self) -> str:
        """Renew every retry period; return why leadership ended."""
        last_renewed = self._renewed_at
        while True:
            await asyncio.sleep(self._s.retry_period_s)
            deadline = last_renewed + self._s.renew_deadline_s
            while True:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return f"could not renew within renew_deadline_s={self._s.renew_deadline_s:g}"
                started = self._clock()
                result = await self._attempt(min(self._timeout_s, remaining))
                if result == "held":
                    last_renewed = started
                    break
                if result == "other":
                    holder = self._observed.holder if self._observed else None
                    return f"the Lease is held by {holder!r}"
                await asyncio.sleep(min(self._s.retry_period_s / 2, max(0.0, deadline - self._clock())))

    # -- one try ----------------------------------------------------------------------------------------
    async def _attempt(self, timeout_s: float) -> Attempt:
        """One try under one deadline (covering both the read and the write)."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self.try_acquire_or_renew(timeout_s)
        except TimeoutError:
            self._log.warning("lease_attempt_failed", reason=f"no answer within {timeout_s:.3g}s")
        except K8sConflict as exc:
            self._log.info("lease_attempt_conflict", reason=str(exc))  # someone wrote first: re-read next time
        except K8sError as exc:
            self._log.warning("lease_attempt_failed", reason=str(exc))
        except Exception:  # a malformed answer must not end the election for good
            self._log.exception("lease_attempt_error")
        return "failed"

    async def try_acquire_or_renew(self, timeout_s: float) -> Attempt:
        me = self._s.identity
        started = self._clock()
        now = datetime.now(UTC)
        try:
            lease = await self._read(timeout_s)
        except K8sNotFound:
            body = self._body(None, now, transitions=0, acquire_time=now)
            await call(
                f"create {self._what}",
                self._coord.create_namespaced_lease(
                    self._s.namespace,
                    body,  # type: ignore[arg-type]  # the stub wants a V1Lease; a dict is sent as is
                    _request_timeout=timeout_s,
                ),
                timeout_s=timeout_s,
            )
            self._saw(LeaseRecord(me, self._duration_s, now, now, 0), self._clock())
            self._renewed_at = started
            return "held"

        record = LeaseRecord.of(lease)
        if record != self._observed:
            self._saw(record, self._clock())
        if record.holder and record.holder != me:
            if self._clock() < self._observed_at + record.duration_s:
                self.leadership.observed(record.holder)
                return "other"
        if record.holder == me:
            transitions, acquire_time = record.transitions, record.acquire_time or now
        else:  # expired or released: take it over
            transitions, acquire_time = record.transitions + (1 if record.holder else 0), now
        body = self._body(lease.metadata.resource_version, now, transitions=transitions, acquire_time=acquire_time)
        await self._replace("update", body, timeout_s)
        self._saw(LeaseRecord(me, self._duration_s, acquire_time, now, transitions), self._clock())
        self._renewed_at = started
        if record.holder != me:
            self._log.info("lease_taken", previous=record.holder, transitions=transitions)
        return "held"

    async def _release(self) -> None:
        """Best effort, bounded: hand the Lease back so a successor can start at once."""
        try:
            async with asyncio.timeout(self._timeout_s):
                lease = await self._read(self._timeout_s)
                if LeaseRecord.of(lease).holder != self._s.identity:
                    return
                now = datetime.now(UTC)
                body = self._body(
                    lease.metadata.resource_version,
                    now,
                    transitions=LeaseRecord.of(lease).transitions,
                    acquire_time=now,
                    holder=None,
                    duration_s=1,
                )
                await self._replace("release", body, self._timeout_s)
                self._log.info("lease_released")
        except (K8sError, TimeoutError) as exc:
            self._log.warning("lease_release_failed", reason=str(exc) or type(exc).__name__)

    # -- helpers ------------------------------------------------------------------------------------------
    async def _read(self, timeout_s: float) -> client.V1Lease:
        return await call(
            f"get {self._what}",
            self._coord.read_namespaced_lease(self._s.lease_name, self._s.namespace, _request_timeout=timeout_s),
            timeout_s=timeout_s,
        )

    async def _replace(self, verb: str, body: dict[str, Any], timeout_s: float) -> None:
        """Write `body` over the Lease; its `resourceVersion` makes the write fail (409) if another
        candidate wrote since it was read."""
        await call(
            f"{verb} {self._what}",
            self._coord.replace_namespaced_lease(
                self._s.lease_name,
                self._s.namespace,
                body,  # type: ignore[arg-type]  # the stub wants a V1Lease; a dict is sent as is (see _body)
                _request_timeout=timeout_s,
            ),
            timeout_s=timeout_s,
        )

    @property
    def _duration_s(self) -> int:
        return max(1, math.ceil(self._s.lease_duration_s))

    def _saw(self, record: LeaseRecord, at: float) -> None:
        self._observed, self._observed_at = record, at

    def _body(
        self,
        resource_version: str | None,
        now: datetime,
        *,
        transitions: int,
        acquire_time: datetime | str,
        holder: str | None | Literal[False] = False,
        duration_s: int | None = None,
    ) -> dict[str, Any]:
        # A plain dict, not a V1Lease: the model would serialise times with isoformat(), which is not the
        # MicroTime the API server reads (no fraction at .0). The client's stubs name only the model as a
        # body, while its ApiClient sends a dict as it is: hence the `type: ignore`s where bodies are sent.
        metadata: dict[str, Any] = {"name": self._s.lease_name, "namespace": self._s.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version  # the optimistic-concurrency guard
        acquired = acquire_time if isinstance(acquire_time, str) else micro_time(acquire_time)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self._s.identity if holder is False else holder,
                "leaseDurationSeconds": duration_s or self._duration_s,
                "acquireTime": acquired,
                "renewTime": micro_time(now),
                "leaseTransitions": transitions,
            },
        }

"""The retry policy: why a try ended before any byte went to the client, and what each reason
means, as one table.

A try ends before the first byte for one `RetryReason`; `RULES` says, for each, whether the
request goes to another member at all, whether the try counts toward `gateway.attempts`
(after which the client gets 502 `upstream_failed`, naming each failure), the verdict it gives
the worker's circuit (`breaker.py`), and the stage it is counted under in
`rlcp_gateway_worker_failures` (None: not the worker's failure):

    reason           resent  a try  breaker      stage
    failed           yes     yes    failed       before_first_byte   a connect timeout, a reset, an answer
                                                                     broken off, a refused pin
    version_refused  yes     yes    none         before_first_byte   an agent's 409: the fence was behind
    engine_dead      yes     yes    eject        before_first_byte   an agent's 503 `engine_dead`
    unreachable      yes     no     unreachable  unreachable         no connection at all
    answer_again     yes     no     none         -                   a pinned member left service meanwhile
    engine_died      no      -      eject        engine_died         the engine died during it: 502

Why each:
- **version_refused** is not counted toward ejection, or a rolling update would eject the members
  it has just moved.
- **unreachable** (the connect refused: nothing listening; or no route, no such host) is down,
  not failing: the try is not counted, the worker is ejected at once (a burst refused together
  is one ejection: `breaker.py`), and the request goes to another member or is held until one
  serves or its hold deadline passes (503 `no_capacity`, naming the members that refused).
  Without this a fleet whose one worker died answered 502 within two retry pauses (~0.2 s),
  before the controller had even noticed. It cannot loop: an ejected worker is not chosen again
  until its backoff is up, and each refused probe doubles it. A connect *timeout* is not
  unreachable (a listening worker whose backlog is full times out too): it is `failed`.
- **answer_again**: a member that cannot refuse a request sent for other weights (Dynamo, pinned)
  answered after an update took it out of service or changed its weights: the answer is dropped
  and the request sent again to a member in service, within its hold deadline (then 503). The
  cost: answers a member finishes while an update takes it out of service are computed twice.
  An answer that names other weights than the fence chose its member at (SGLang) goes so too.
- **engine_dead** vs **engine_died**: a request that arrives at a dead engine never reached it and
  goes to the next worker; one **during which** the engine died (a 5xx with `X-RL-Engine-Died`,
  or vLLM's own dead-engine message from a stock server) is not sent again, since it may be what
  killed the engine and would kill the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Literal

from rlcp.controlplane.gateway.breaker import Verdict
from rlcp.controlplane.gateway.upstream import ConnectFailed, UpstreamError

# `rlcp_gateway_worker_failures`' `stage` label (mid_stream: a stream broken after its headers went out).
FailureStage = Literal["before_first_byte", "unreachable", "engine_died", "mid_stream"]


class RetryReason(Enum):
    FAILED = "failed"
    VERSION_REFUSED = "version_refused"
    ENGINE_DEAD = "engine_dead"
    UNREACHABLE = "unreachable"
    ANSWER_AGAIN = "answer_again"
    ENGINE_DIED = "engine_died"


@dataclass(frozen=True, kw_only=True)
class RetryRule:
    resent: bool  # another member may take the request
    counts_as_try: bool  # toward `gateway.attempts`, and named in the 502
    breaker: Verdict  # what the try says of the worker's circuit
    stage: FailureStage | None  # counted as the worker's failure, so; None: not its failure


RULES: Mapping[RetryReason, RetryRule] = MappingProxyType(
    {
        RetryReason.FAILED: RetryRule(resent=True, counts_as_try=True, breaker="failed", stage="before_first_byte"),
        RetryReason.VERSION_REFUSED: RetryRule(
            resent=True, counts_as_try=True, breaker="none", stage="before_first_byte"
        ),
        RetryReason.ENGINE_DEAD: RetryRule(resent=True, counts_as_try=True, breaker="eject", stage="before_first_byte"),
        RetryReason.UNREACHABLE: RetryRule(
            resent=True, counts_as_try=False, breaker="unreachable", stage="unreachable"
        ),
        RetryReason.ANSWER_AGAIN: RetryRule(resent=True, counts_as_try=False, breaker="none", stage=None),
        RetryReason.ENGINE_DIED: RetryRule(resent=False, counts_as_try=False, breaker="eject", stage="engine_died"),
    }
)


class TryFailed(Exception):
    """The try ended before any byte went to the client, for `reason` (`status`: the worker's
    answer's, where it answered)."""

    def __init__(self, message: str, reason: RetryReason = RetryReason.FAILED, *, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


def connect_failure(exc: UpstreamError) -> TryFailed:
    """Why the request got no answer (`upstream.py`'s errors), and whether the worker could not
    be connected to at all. A TLS failure is not that (something listens and answered the
    handshake), nor a connect timeout (a full backlog times out too), nor a pooled connection the
    worker had closed (`Disconnected`)."""
    if isinstance(exc, ConnectFailed):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return TryFailed(f"refused the connection (nothing listening): {exc}", RetryReason.UNREACHABLE)
        return TryFailed(f"unreachable: {type(exc).__name__}: {exc}", RetryReason.UNREACHABLE)
    return TryFailed(f"{type(exc).__name__}: {exc}")


def refusals(refused: Mapping[str, str]) -> str:
    """The members that could not be connected to for a request, for its error message."""
    if not refused:
        return ""
    said = "; ".join(f"{worker} {why}" for worker, why in list(refused.items())[:8])
    return f"; members that refused this request's connection or could not be reached (not counted as tries): {said}"

"""Which members inside the fence may not take one more request now: at their admission limit
(`gateway.max_in_flight_per_worker` requests already out to them) or ejected by their circuit
(`breaker.py`). Pure code; `proxy.py` leaves them out of the balancer's candidates, and a request
that finds every member so is held, as during a pause, until one frees up or its hold deadline
passes (then 503 with `Retry-After`).

The limit protects a worker's queue from one gateway's burst (an engine's own queue has no
bound, and a rollout waiting there holds its slot in the batch plan of the whole step); several
gateway replicas each keep their own count, so the worker sees at most replicas x limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlcp.controlplane.gateway.breaker import Breakers


def unavailable(
    workers: Iterable[str], *, in_flight: Mapping[str, int], limit: int | None, breakers: Breakers
) -> frozenset[str]:
    """The workers among `workers` not to choose now (empty at once when nothing is limited or ejected)."""
    if limit is None and not breakers.ejected:
        return frozenset()
    return frozenset(
        w for w in workers if (limit is not None and in_flight.get(w, 0) >= limit) or not breakers.available(w)
    )


def why_unavailable(
    workers: Iterable[str], *, in_flight: Mapping[str, int], limit: int | None, breakers: Breakers
) -> str:
    """Said in the 503 when every member inside the fence was unavailable until the deadline."""
    full = sorted(w for w in workers if limit is not None and in_flight.get(w, 0) >= limit)
    out = sorted(w for w in workers if w not in full and not breakers.available(w))
    parts = []
    if full:
        parts.append(f"at gateway.max_in_flight_per_worker ({limit}): {', '.join(full[:8])}")
    if out:
        why = "failing requests, a refused connection or a dead engine; backoff not over"
        parts.append(f"ejected ({why}): {', '.join(out[:8])}")
    return "every member inside the fence is " + "; ".join(parts) if parts else "no member is available"

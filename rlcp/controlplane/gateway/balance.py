"""Which member takes a request. Pure code: the proxy supplies the counts.

Least outstanding requests, ties taken in turn (a rotating start), so an idle fleet still
spreads one request at a time over every member and a test can predict it. With a
session key, rendezvous hashing (highest random weight, a form of consistent hashing): each
key ranks every worker by hash(key, worker) and takes the best one inside the fence, so a
member leaving moves only the sessions it held, and multi-turn rollouts keep reusing one
worker's prefix cache.

Plain affinity does not balance: a few hot sessions (RL rollouts of one prompt group, long
agentic episodes) pile onto the workers their keys hash to. With a `load_factor`, affinity is
bounded-load consistent hashing (Mirrokni, Thorup and Zadimoghaddam, 2018; HAProxy's
`hash-balance-factor`, Envoy's and Vimeo's use of it): no worker takes a session's request while
it already has `ceil(load_factor x (outstanding + 1) / workers)` requests out; the session then
goes to its next worker in its own ranking (the same fallback every time, so its prefix cache
there is reused too), and back to its own as soon as that is under the bound. Outstanding counts
are the gateway's own (per replica).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence


def _score(key: str, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\x00{worker_id}".encode(), digest_size=8).digest(), "big")


def rank_for_session(key: str, candidates: Sequence[str]) -> list[str]:
    """Every candidate, the session's own worker first (then its fallbacks, in order)."""
    return sorted(candidates, key=lambda w: _score(key, w), reverse=True)


def bounded(ranked: list[str], outstanding: Mapping[str, int], load_factor: float) -> list[str]:
    """`ranked` with the workers at the load bound moved last (each part in its order)."""
    cap = math.ceil(load_factor * (sum(outstanding.get(w, 0) for w in ranked) + 1) / len(ranked))
    under = [w for w in ranked if outstanding.get(w, 0) < cap]
    return under + [w for w in ranked if outstanding.get(w, 0) >= cap] if len(under) < len(ranked) else ranked


def order(
    candidates: Sequence[str],
    outstanding: Mapping[str, int],
    *,
    session: str | None = None,
    exclude: frozenset[str] = frozenset(),
    turn: int = 0,
    load_factor: float | None = None,
) -> list[str]:
    """Candidates in the order to try them, without those in `exclude` (already failed);
    `turn` rotates which of the least loaded comes first; `load_factor` bounds a session's
    worker's load (None: plain affinity)."""
    pool = [c for c in candidates if c not in exclude]
    if session is not None:
        ranked = rank_for_session(session, pool)
        return bounded(ranked, outstanding, load_factor) if load_factor is not None and ranked else ranked
    n = len(pool) or 1
    return [w for _, _, w in sorted((outstanding.get(w, 0), (i - turn) % n, w) for i, w in enumerate(pool))]

"""Which member takes a request. Pure code: the proxy supplies the counts.

Least outstanding requests, ties taken in turn (a rotating start), so an idle fleet still
spreads one request at a time over every member and a test can predict it. With a
session key, rendezvous hashing (highest random weight, a form of consistent hashing): each
key ranks every worker by hash(key, worker) and takes the best one inside the fence, so a
member leaving moves only the sessions it held, and multi-turn rollouts keep reusing one
worker's prefix cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence


def _score(key: str, worker_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\x00{worker_id}".encode(), digest_size=8).digest(), "big")


def rank_for_session(key: str, candidates: Sequence[str]) -> list[str]:
    """Every candidate, the session's own worker first (then its fallbacks, in order)."""
    return sorted(candidates, key=lambda w: _score(key, w), reverse=True)


def order(candidates: Sequence[str], outstanding: Mapping[str, int], *, session: str | None = None,
          exclude: frozenset[str] = frozenset(), turn: int = 0) -> list[str]:
    """Candidates in the order to try them, without those in `exclude` (already failed);
    `turn` rotates which of the least loaded comes first."""
    pool = [c for c in candidates if c not in exclude]
    if session is not None:
        return rank_for_session(session, pool)
    n = len(pool) or 1
    return [w for _, _, w in sorted((outstanding.get(w, 0), (i - turn) % n, w) for i, w in enumerate(pool))]

"""Session affinity: a session's requests go to its own worker, so multi-turn rollouts keep
reusing one worker's prefix cache.

Rendezvous hashing (highest random weight, a form of consistent hashing): each key ranks every
worker by hash(key, worker) and takes the best one inside the fence, so a member leaving moves
only the sessions it held.

Plain affinity does not balance: a few hot sessions (RL rollouts of one prompt group, long
agentic episodes) pile onto the workers their keys hash to. With a `load_factor`, affinity is
bounded-load consistent hashing (Mirrokni, Thorup and Zadimoghaddam, 2018; HAProxy's
`hash-balance-factor`, Envoy's and Vimeo's use of it): no worker takes a session's request while
it already has `ceil(load_factor x (outstanding + 1) / workers)` requests out; the session then
goes to its next worker in its own ranking (the same fallback every time, so its prefix cache
there is reused too), and back to its own as soon as that is under the bound. Outstanding counts
are the gateway's own (per replica).

A request without a session key goes to the `without_key` policy (least load, from the factory).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

from rlcp.controlplane.gateway.balancing.policy import BalancingPolicy


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


class SessionAffinity:
    def __init__(self, *, load_factor: float | None, without_key: BalancingPolicy) -> None:
        """`load_factor`: the bound on a session's worker's load (None: plain affinity)."""
        self.load_factor = load_factor
        self.without_key = without_key

    def pick(
        self, members: Sequence[str], load: Mapping[str, int], *, key: str | None, exclude: frozenset[str]
    ) -> str | None:
        if key is None:
            return self.without_key.pick(members, load, key=None, exclude=exclude)
        ranked = rank_for_session(key, [m for m in members if m not in exclude])
        if not ranked:
            return None
        return (bounded(ranked, load, self.load_factor) if self.load_factor is not None else ranked)[0]

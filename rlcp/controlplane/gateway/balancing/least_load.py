"""Least outstanding requests, ties taken in turn (a rotating start), so an idle fleet still
spreads one request at a time over every member and a test can predict it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class LeastLoad:
    def __init__(self) -> None:
        self._turn = 0  # rotates which of the least loaded comes first

    def pick(
        self, members: Sequence[str], load: Mapping[str, int], *, key: str | None = None, exclude: frozenset[str]
    ) -> str | None:
        pool = [m for m in members if m not in exclude] if exclude else members
        self._turn += 1
        n = len(pool)
        best: str | None = None
        best_rank = (0, 0)
        for i, member in enumerate(pool):  # min over (load, place after the turn's start): one pass
            rank = (load.get(member, 0), (i - self._turn) % n)
            if best is None or rank < best_rank:
                best, best_rank = member, rank
        return best

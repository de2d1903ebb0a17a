"""What a balancing policy is: given the members a request may go to, pick one.

A policy sees the fence's members (sorted ids, from the routing table), the gateway's own count
of requests out to each, the request's session key (None without one) and the members to leave
out (tried already for this request, at their admission limit, or ejected). It returns the one
to try, or None when every candidate is left out (the proxy then holds the request). Called again
for each try of a request, with the members tried so far left out: its successive picks are the
request's failover order.

A policy may keep state of its own (least load rotates its ties), but never blocks and never
does I/O: one call per try, on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class BalancingPolicy(Protocol):
    def pick(
        self, members: Sequence[str], load: Mapping[str, int], *, key: str | None, exclude: frozenset[str]
    ) -> str | None:
        """The member to try, or None when every member is in `exclude`."""
        ...

"""One generation counter for everything the state document shows.

Every writer of fleet state (the registry on a membership change or a status read, the
desired-state keeper, the operation log, the weight-transfer session) bumps it; the state
document is rebuilt only when it moved (`view.StateCache`). One counter, so a writer
cannot be forgotten in a cache key.
"""

from __future__ import annotations


class ChangeCounter:
    def __init__(self) -> None:
        self.generation = 0

    def bump(self) -> None:
        self.generation += 1

"""One generation counter for everything the state document shows.

Every writer of fleet state (the registry on a membership change or a status read, the
desired-state keeper, the operation log, the weight-transfer session) bumps it; the state
document is rebuilt only when it moved (`view.StateCache`). One counter, so a writer
cannot be forgotten in a cache key. A data plane keeping its own copy of the fence (Envoy,
`gateway/envoy/`) listens to it to learn, without polling, that the fence may have moved.
"""

from __future__ import annotations

from collections.abc import Callable


class ChangeCounter:
    def __init__(self) -> None:
        self.generation = 0
        self.listeners: list[Callable[[], None]] = []  # called on every bump: cheap, never blocking

    def bump(self) -> None:
        self.generation += 1
        for listener in self.listeners:
            listener()

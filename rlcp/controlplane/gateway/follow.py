"""A standalone gateway's view of the fleet: a controller's `GET /v1/rl/state`, followed.

Several gateway replicas can serve behind one Service this way, each reading the leader's
(or any replica's: followers serve reads) state document every `interval_s`, with a deadline.
A failed read keeps the last state: the fence keeps admitting what it admitted, and the
members' own failures are handled per request (failover before the first byte).

The reading is `rlcp.core.follow.FollowedDocument`'s: each read names the `ETag` of the document
held, so while the fleet is unchanged the controller answers 304 and nothing is parsed here;
a new generation is parsed once, and one that does not parse is refused (the last state stays).
"""

from __future__ import annotations

import aiohttp

from rlcp.core.cached import CachedBody
from rlcp.core.follow import FollowedDocument
from rlcp.core.wire.controller.state import FleetState


class FollowedState:
    def __init__(
        self, *, session: aiohttp.ClientSession, url: str, token: str | None, interval_s: float, timeout_s: float = 5.0
    ) -> None:
        self._document = FollowedDocument(
            session=session,
            url=url.rstrip("/") + "/v1/rl/state",
            token=token,
            interval_s=interval_s,
            timeout_s=timeout_s,
            accept=self._parse,
        )
        self._state: FleetState | None = None
        self._generation = 0

    def _parse(self, body: CachedBody) -> None:
        self._state = FleetState.model_validate_json(body.data)
        self._generation += 1

    @property
    def last_error(self) -> str | None:
        return self._document.last_error

    def current(self) -> tuple[int, FleetState] | None:
        return None if self._state is None else (self._generation, self._state)

    async def read_once(self) -> None:
        await self._document.refresh()

    async def run(self, *, iterations: int | None = None) -> None:
        await self._document.run(iterations=iterations)

"""A standalone gateway's view of the fleet: a controller's `GET /v1/rl/state`, followed.

Several gateway replicas can serve behind one Service this way, each reading the leader's
(or any replica's: followers serve reads) state document every `interval_s`, with a deadline.
A failed read keeps the last state: the fence keeps admitting what it admitted, and the
members' own failures are handled per request (failover before the first byte).

Each read names the `ETag` of the document it holds (`If-None-Match`): while the fleet is
unchanged the controller answers 304 with no body, and nothing is parsed here. The answer
comes gzip-compressed otherwise (aiohttp asks for it; the gateway's own session, which hands
bodies on untouched, leaves the decompression to this module).
"""

from __future__ import annotations

import asyncio
import gzip
import zlib

import aiohttp
import structlog
from pydantic import ValidationError

from rlcore.wire.controller import FleetState

log = structlog.get_logger("controlplane.gateway.follow")


def _gunzip(body: bytes) -> bytes:
    try:
        return gzip.decompress(body)
    except (OSError, EOFError, zlib.error) as exc:
        raise RuntimeError(f"a gzip body that does not decompress: {exc}") from exc


class FollowedState:
    def __init__(self, *, session: aiohttp.ClientSession, url: str, token: str | None, interval_s: float,
                 timeout_s: float = 5.0) -> None:
        self._session = session
        self._url = url.rstrip("/") + "/v1/rl/state"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._interval_s, self._timeout_s = interval_s, timeout_s
        self._body: bytes | None = None
        self._etag: str | None = None
        self._state: FleetState | None = None
        self._generation = 0
        self.last_error: str | None = None

    def current(self) -> tuple[int, FleetState] | None:
        return None if self._state is None else (self._generation, self._state)

    async def read_once(self) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                headers = self._headers if self._etag is None else {**self._headers, "If-None-Match": self._etag}
                async with self._session.get(self._url, headers=headers) as resp:
                    body = await resp.read()
                    etag = resp.headers.get("ETag")
                    if resp.status not in (200, 304):
                        raise RuntimeError(f"GET {self._url} answered {resp.status}: {body[:200]!r}")
                    if resp.headers.get("Content-Encoding") == "gzip" and not self._session.auto_decompress:
                        body = _gunzip(body)  # the gateway's session hands bodies on as they came
            if resp.status == 200:  # a 304 means the document held is current
                if body != self._body:
                    self._state, self._body = FleetState.model_validate_json(body), body
                    self._generation += 1
                self._etag = etag  # None from a controller without tags: then every read is a full one
            if self.last_error is not None:
                log.info("controller_state_followed_again", url=self._url)
            self.last_error = None
        except (TimeoutError, aiohttp.ClientError, RuntimeError, ValidationError) as exc:
            if self.last_error is None:
                log.warning("controller_state_unreadable", url=self._url, error=str(exc))
            self.last_error = f"{type(exc).__name__}: {exc}"

    async def run(self, *, iterations: int | None = None) -> None:
        n = 0
        while iterations is None or n < iterations:
            n += 1
            await self.read_once()
            await asyncio.sleep(self._interval_s)

"""A document another process serves with `rlcp.core.cached`, followed over HTTP.

Each read names the tag of the document held (`If-None-Match`), so while nothing changes the
server answers 304 and sends nothing. A new generation is kept as the bytes it came in
(`CachedBody`): gzip-compressed when the session hands bodies on untouched
(`auto_decompress=False`, a proxy's session), then decompressed once. Reads can overlap (a
poll, and a read asked for after a write): a document replaces the one held only if the
generation its tag names is newer; an answer without such a tag replaces it when its bytes
differ. `accept(body)` may check a new body before it is taken (the gateway parses the
state); if it raises, the body is refused, and the next read fetches it again.

Followers: the API front's replica of the core's state (`rlcp/controlplane/front/`) and a
standalone gateway's view of a controller (`rlcp/controlplane/gateway/follow.py`).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable

import aiohttp
import structlog

from rlcp.core.cached import CachedBody, parse_tag

log = structlog.get_logger("rlcp.core.follow")
# What a read can meet: no answer, a bad status, a body that does not decompress, one `accept` refuses.
_FAILURES = (TimeoutError, aiohttp.ClientError, OSError, EOFError, zlib.error, RuntimeError, ValueError)


class FollowedDocument:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        url: str,
        token: str | None,
        interval_s: float,
        timeout_s: float,
        accept: Callable[[CachedBody], None] | None = None,
    ) -> None:
        self._session = session
        self.url = url
        self._headers = {"Accept-Encoding": "gzip", **({"Authorization": f"Bearer {token}"} if token else {})}
        self._interval_s, self._timeout_s = interval_s, timeout_s
        self._accept = accept
        self.body: CachedBody | None = None
        self._tag: tuple[str, int] | None = None
        self.last_ok: float | None = None  # monotonic time of the last read the server answered
        self.last_error: str | None = None

    async def fetch(self) -> bool:
        """One read; True when it brought a new generation. Raises what went wrong."""
        held_tag = self.body.etag if self.body is not None else ""
        headers = {**self._headers, "If-None-Match": held_tag} if held_tag else self._headers
        async with asyncio.timeout(self._timeout_s):
            async with self._session.get(self.url, headers=headers) as resp:
                data = await resp.read()
                etag, encoding = resp.headers.get("ETag"), resp.headers.get("Content-Encoding")
        if resp.status not in (200, 304):
            raise RuntimeError(f"GET {self.url} answered {resp.status}: {data[:200]!r}")
        self.last_ok = time.monotonic()
        if resp.status == 304:
            return False
        tag = parse_tag(etag) if etag else None
        held = self._tag
        if tag is not None and held is not None and held[0] == tag[0] and held[1] >= tag[1]:
            return False  # an older read that overlapped a newer one
        compressed = encoding == "gzip" and not self._session.auto_decompress
        body = CachedBody.from_gzip(etag or "", data) if compressed else CachedBody(etag=etag or "", data=data)
        if tag is None and self.body is not None and body.data == self.body.data:
            return False
        if self._accept is not None:
            self._accept(body)
        self.body, self._tag = body, tag
        return True

    async def refresh(self) -> bool:
        """Read now; True when the server answered. A failure is logged once and kept in
        `last_error`, not raised."""
        try:
            await self.fetch()
        except _FAILURES as exc:
            if self.last_error is None:
                log.warning("followed_document_unreadable", url=self.url, error=f"{type(exc).__name__}: {exc}")
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        if self.last_error is not None:
            log.info("followed_document_readable_again", url=self.url)
        self.last_error = None
        return True

    async def run(self, *, iterations: int | None = None) -> None:
        n = 0
        while iterations is None or n < iterations:
            n += 1
            await self.refresh()
            await asyncio.sleep(self._interval_s)

    def age_s(self) -> float | None:
        """Seconds since the server last answered a read (None: never)."""
        return None if self.last_ok is None else time.monotonic() - self.last_ok

"""The core's `/v1/rl/state`, followed by the front: the bytes and tag the core made.

A read every `interval_s` names the tag held (`If-None-Match`), so while nothing changes
the core answers 304 and sends nothing; a change arrives gzip-compressed, as the core made
it, and is kept as it came (plain readers get it decompressed once). Reads can overlap (the
poll and a write's fresh read): a document replaces the held one only if its generation,
which the tag names, is newer.

Reads after writes: the front proxies every write to the core and, before answering it,
reads the state again (`refresh`), so a client that sees a write's answer and then reads the
state sees the write's effects, as it would from the core itself.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import structlog

from rlcore.cached import CachedBody

log = structlog.get_logger("controlplane.front.replica")


def parse_tag(etag: str) -> tuple[str, int] | None:
    """(instance, generation) of a tag `W/"<instance>.<generation>"` (rlcore.cached.EntityTags)."""
    opaque = etag.removeprefix("W/").strip('"')
    instance, _, generation = opaque.rpartition(".")
    return (instance, int(generation)) if instance and generation.isdigit() else None


class StateReplica:
    def __init__(self, *, session: aiohttp.ClientSession, core_url: str, token: str | None, interval_s: float,
                 timeout_s: float) -> None:
        self._session = session  # auto_decompress=False: bodies are kept as the core sent them
        self._url = core_url.rstrip("/") + "/v1/rl/state"
        self._headers = {"Accept-Encoding": "gzip", **({"Authorization": f"Bearer {token}"} if token else {})}
        self._interval_s, self._timeout_s = interval_s, timeout_s
        self.body: CachedBody | None = None
        self._tag: tuple[str, int] | None = None
        self.last_ok: float | None = None  # monotonic time of the last read the core answered
        self.last_error: str | None = None

    async def fetch(self) -> None:
        """One read of the core's document; raises what went wrong."""
        headers = self._headers if self.body is None else {**self._headers, "If-None-Match": self.body.etag}
        async with asyncio.timeout(self._timeout_s):
            async with self._session.get(self._url, headers=headers) as resp:
                data = await resp.read()
                etag, encoding = resp.headers.get("ETag"), resp.headers.get("Content-Encoding")
        if resp.status == 200 and etag:
            tag = parse_tag(etag)
            if tag is None:
                raise RuntimeError(f"GET {self._url} answered an entity tag of no generation: {etag!r}")
            held = self._tag
            if held is None or held[0] != tag[0] or held[1] < tag[1]:  # a new core life, or newer
                self.body = CachedBody.from_gzip(etag, data) if encoding == "gzip" else CachedBody(etag=etag,
                                                                                                 data=data)
                self._tag = tag
        elif resp.status != 304:
            raise RuntimeError(f"GET {self._url} answered {resp.status}: {data[:200]!r}")
        self.last_ok = time.monotonic()

    async def refresh(self) -> bool:
        """Read now; a failure is logged and kept in `last_error`, not raised."""
        try:
            await self.fetch()
        except (TimeoutError, aiohttp.ClientError, RuntimeError, OSError) as exc:
            if self.last_error is None:
                log.warning("core_state_unreadable", url=self._url, error=f"{type(exc).__name__}: {exc}")
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        if self.last_error is not None:
            log.info("core_state_followed_again", url=self._url)
        self.last_error = None
        return True

    async def run(self, *, iterations: int | None = None) -> None:
        n = 0
        while iterations is None or n < iterations:
            n += 1
            await self.refresh()
            await asyncio.sleep(self._interval_s)

    def age_s(self) -> float | None:
        """Seconds since the core last answered a read (None: never)."""
        return None if self.last_ok is None else time.monotonic() - self.last_ok

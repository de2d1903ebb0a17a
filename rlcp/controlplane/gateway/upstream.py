"""The gateway's HTTP/1.1 client to its workers: a keep-alive pool on asyncio's transports (the
stock loop and uvloop alike), answers parsed by httptools (llhttp, the parser uvicorn runs).

Why its own: on the forwarding path aiohttp's client (`ClientSession._request` and what it calls)
was about 40% of the gateway's CPU samples, more than the gateway's own code and aiohttp's server
together (docs/performance.md, section 7). What the gateway needs of a client is small, and this is
that and no more:

- **Pooling.** One pool per worker origin (`http[s]://host:port`), no limit on connections at
  once. A connection goes back to the pool only after a complete answer that keeps it alive; it
  is reused (the most recent first) only within `idle_s` of that answer, and closed once idle
  longer (`gateway.upstream_idle_timeout_s`, kept under the workers' own keep-alive, so the
  gateway does not reuse one the worker is closing). One the worker closed is never reused.
- **A request is one write**: its line, `Host`, the caller's headers, `Content-Length` and the
  body. Nothing else is added (aiohttp added `Accept`, `Accept-Encoding` and `User-Agent`).
- **Answers**: `Content-Length`, chunked, or delimited by the connection's close. A stream
  (`text/event-stream`) is handed over at its headers and read as it comes (`Answer.read_chunk`,
  whatever arrived since the last read; the worker's socket paused while 64 KiB wait unread);
  any other answer is read whole first, so the caller gets its body with its status.
- **Deadlines**: the connect (`connect_s`), and the whole request, from its start to its
  answer's last byte, a stream's included (`total_s`), as aiohttp's `ClientTimeout(total=...,
  sock_connect=...)` did for the gateway. No per-read deadline (the gateway had none).
- **Errors** are `UpstreamError`s, translated here from whatever the loop raised:

      UpstreamError                 no complete answer; also a TLS handshake that failed
      ├── ConnectFailed             the connect itself failed: refused, no route, no such host (`os_error`)
      ├── ConnectTimeout            no connection within `connect_s` (a full backlog times out too)
      ├── Disconnected              the worker closed the connection before its answer's end
      ├── AnswerTimeout             no complete answer within `total_s`
      └── BadAnswer                 not HTTP/1.1 that the parser reads

- **An answer released before its end** (the caller gave up, or its client went away) closes
  its connection, so the worker sees the request cancelled.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict

from rlcp.core.deadline import timeout as running_timeout

STREAM_TYPE = "text/event-stream"
_HIGH_WATER = 1 << 16  # a stream's unread bytes before the worker's socket is paused
_ONE_WRITE = 1 << 16  # a body up to this size goes out in the same write as the head


class UpstreamError(Exception):
    """A try that got no complete answer from its worker."""


class ConnectFailed(UpstreamError):
    def __init__(self, message: str, os_error: OSError) -> None:
        super().__init__(message)
        self.os_error = os_error


class ConnectTimeout(UpstreamError, TimeoutError):
    pass


class Disconnected(UpstreamError):
    pass


class AnswerTimeout(UpstreamError, TimeoutError):
    pass


class BadAnswer(UpstreamError):
    pass


class _Origin:
    """A worker's address, as parsed once, with its idle connections (oldest first)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        secure = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if secure else 80)
        self.tls = ssl.create_default_context() if secure else None
        self.prefix = parts.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.name = f"{host}:{self.port}"
        self.host_header = host if self.port == (443 if secure else 80) else self.name
        self.idle: deque[_Conn] = deque()


class _Conn(asyncio.Protocol):
    """One connection, and the answer it is reading (one request at a time); the parser's callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, origin: _Origin) -> None:
        self.loop, self.origin = loop, origin
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self.parser = httptools.HttpResponseParser(self)  # llhttp reads one answer after another
        self._begin()

    def _begin(self) -> None:
        """Clean state for the next answer."""
        self.busy, self.done, self.streamed, self.paused = False, False, False, False
        self.keep_alive, self.until_close = False, False
        self.status, self.size = 0, 0
        self.raw: list[tuple[str, str]] = []
        self.headers: CIMultiDict[str] | None = None
        self.content_type = ""
        self.parts: list[bytes] = []
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def send(self, data: bytes, body: bytes, deadline: float, total_s: float) -> asyncio.Future[None]:
        """Write the request; the future is done at the answer's headers (a stream) or its end."""
        assert self.transport is not None
        if self.busy or self.done:
            self._begin()
        self.busy = True
        self.waiter = waiter = self.loop.create_future()
        self.timer = self.loop.call_at(deadline, self._expire, total_s)
        if len(body) <= _ONE_WRITE:
            self.transport.write(data + body)
        else:
            self.transport.write(data)
            self.transport.write(body)
        return waiter

    # -- the transport's callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of asyncio's
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.busy or self.done:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            said = exc.__context__ if isinstance(exc.__context__, BadAnswer) else exc
            self._fail(BadAnswer(f"the answer from {self.origin.name} is not HTTP/1.1 the gateway reads: {said}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.busy or self.done or self.error is not None:
            return
        if self.until_close and self.headers is not None:  # such a body ends with the connection
            self.on_message_complete()
            return
        said = f": {exc}" if exc else ""
        if self.headers is None:
            self._fail(Disconnected(f"{self.origin.name} closed the connection before answering{said}"))
        else:
            self._fail(Disconnected(f"the answer from {self.origin.name} broke off after its headers{said}"))

    # -- the parser's callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.done:  # a second answer to one request: raised through the parser (`data_received`)
            raise BadAnswer(f"{self.origin.name} answered more than once")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue): the real one follows
            self.raw = []
            return
        self.status = status
        self.headers = headers = CIMultiDict(self.raw)
        kind = headers.get("Content-Type")
        self.content_type = kind.partition(";")[0].strip().lower() if kind else "application/octet-stream"
        self.until_close = status not in (204, 304) and not (
            "Content-Length" in headers or "Transfer-Encoding" in headers
        )
        if self.content_type == STREAM_TYPE:
            self.streamed = True
            self._wake()

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        if self.streamed:
            self.size += len(body)
            if self.size > _HIGH_WATER and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        if self.status == 0:  # the end of an interim answer
            return
        self.done = True
        self.keep_alive = not self.until_close and self.parser.should_keep_alive()
        if self.timer is not None:
            self.timer.cancel()
        self._wake()

    # -- the answer's end -----------------------------------------------------------------------
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.done or self.error is not None:
            return
        self.error = error
        if self.timer is not None:
            self.timer.cancel()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    def _expire(self, total_s: float) -> None:
        if self.done:
            return
        self._fail(AnswerTimeout(f"no complete answer from {self.origin.name} within {total_s:g}s"))
        self.close()

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class Answer:
    """A worker's answer: its status and headers (the caller's to change), its `body` when not a
    stream (a stream is read with `read_chunk`). `release` it once done: its connection goes back
    to the pool or closes."""

    __slots__ = ("status", "headers", "content_type", "streamed", "body", "_conn", "_pool")

    def __init__(self, pool: UpstreamPool, conn: _Conn) -> None:
        assert conn.headers is not None
        self.status, self.headers, self.content_type = conn.status, conn.headers, conn.content_type
        self.streamed = conn.streamed
        self.body = b"" if conn.streamed else b"".join(conn.parts)
        self._pool: UpstreamPool | None = pool
        self._conn = conn

    async def read_chunk(self) -> bytes:
        """What arrived of a stream since the last read, waiting for some; b"" at its end."""
        conn = self._conn
        while True:
            if conn.parts:
                data = conn.parts[0] if len(conn.parts) == 1 else b"".join(conn.parts)
                conn.parts, conn.size = [], 0
                if conn.paused and conn.transport is not None:
                    conn.paused = False
                    conn.transport.resume_reading()
                return data
            if conn.error is not None:
                raise conn.error
            if conn.done:
                return b""
            conn.waiter = conn.loop.create_future()
            await conn.waiter

    async def read(self) -> bytes:
        """The whole body (a stream's: what is left of it, to its end)."""
        if not self.streamed:
            return self.body
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        if self._pool is not None:
            self._pool.release(self._conn)
            self._pool = None


class UpstreamPool:
    """Requests to workers over kept-alive connections, one pool per worker origin."""

    def __init__(self, *, idle_s: float, connect_s: float, total_s: float) -> None:
        self.idle_s, self.connect_s, self.total_s = idle_s, connect_s, total_s
        self._origins: dict[str, _Origin] = {}
        self._sweeper: asyncio.TimerHandle | None = None

    async def request(self, url: str, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Answer:
        """Send `method target` to the worker at `url` (its base URL); the answer once its
        headers (a stream) or all of it came. Raises `UpstreamError`."""
        origin = self._origins.get(url) or self._origin(url)
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self.total_s
        conn = self._reuse(origin, now) or await self._connect(loop, origin, deadline)
        lines = "\r\n".join(map(": ".join, headers.items()))
        head = (
            f"{method} {origin.prefix}{target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"
            f"Content-Length: {len(body)}\r\n{lines}{_END if lines else _CRLF}"
        )
        waiter = conn.send(head.encode("utf-8", "surrogateescape"), body, deadline, self.total_s)
        try:
            await waiter
        except BaseException:
            self.release(conn)
            raise
        return Answer(self, conn)

    def release(self, conn: _Conn) -> None:
        """The connection back to its pool after a complete answer that keeps it, else closed."""
        if conn.timer is not None:
            conn.timer.cancel()
        conn.waiter = None
        if not (conn.done and conn.keep_alive) or conn.lost or conn.transport is None or conn.transport.is_closing():
            conn.close()
            return
        conn.busy = False
        conn.idle_since = conn.loop.time()
        conn.origin.idle.append(conn)
        if self._sweeper is None:
            self._sweeper = conn.loop.call_at(conn.idle_since + self.idle_s, self._sweep, conn.loop)

    def close(self) -> None:
        """Close every idle connection (those in use close when released)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.popleft().close()

    def idle(self, url: str) -> list[asyncio.Transport]:
        """The connections kept idle for the worker at `url` (those closed since excluded)."""
        origin = self._origins.get(url)
        idle = origin.idle if origin is not None else ()
        return [c.transport for c in idle if c.transport is not None and not (c.lost or c.transport.is_closing())]

    def _origin(self, url: str) -> _Origin:
        origin = self._origins[url] = _Origin(url)
        return origin

    def _reuse(self, origin: _Origin, now: float) -> _Conn | None:
        idle = origin.idle
        while idle:
            conn = idle.pop()
            if conn.lost or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self.idle_s:  # and every one under it, older still
                conn.close()
                continue
            return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, origin: _Origin, deadline: float) -> _Conn:
        budget = min(self.connect_s, deadline - loop.time())
        try:
            # A loopback connect is done in the kernel at once: a loop held past the budget (a GC
            # pause, a loaded machine) must not fail a worker that accepted (`rlcp.core.deadline`).
            async with running_timeout(budget):
                _, conn = await loop.create_connection(
                    partial(_Conn, loop, origin), origin.host, origin.port, ssl=origin.tls
                )
        except TimeoutError as exc:
            if exc.errno is not None:  # the system's own connect timeout, not ours
                raise ConnectFailed(f"cannot connect to {origin.name}: {exc}", exc) from exc
            raise ConnectTimeout(f"no connection to {origin.name} within {budget:g}s") from None
        except ssl.SSLError as exc:
            raise UpstreamError(f"TLS with {origin.name} failed: {exc}") from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {origin.name}: {exc}", exc) from exc
        return conn

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections idle past `idle_s`; again at the next one's time, while any are idle."""
        self._sweeper = None
        now, due = loop.time(), None
        for origin in self._origins.values():
            idle = origin.idle
            while idle and (idle[0].lost or now - idle[0].idle_since >= self.idle_s):
                idle.popleft().close()
            if idle:
                first = idle[0].idle_since
                due = first if due is None else min(due, first)
        if due is not None:
            self._sweeper = loop.call_at(due + self.idle_s, self._sweep, loop)


_CRLF = "\r\n"
_END = "\r\n\r\n"

"""Fault rules, and the two places they apply: in front of an in-process agent (an aiohttp
middleware) or in front of any process (an HTTP/1.1 proxy on loopback).

A rule matches a request by path, and optionally by method, and says what to do instead of
answering normally:

- `status`: answer that status with a JSON error body, without reaching the server;
- `hang`: never answer (the caller's deadline is what is being tested);
- `delay`: wait `delay_s`, then serve the request normally;
- `reset`: reset the connection (RST) before any answer;
- `cut_after_headers` / `cut_mid_body` (proxy only): let the server do the work, send the client
  the status line and headers (and half the body), then reset the connection.

A rule fires `times` times (None: until cleared). Every request is logged in `FaultRules.seen`
with what was done to it (the middleware logs only the faults), so a test can check that a
fault really fired.

    agent.faults["/pause"] = Fault("hang")                          # any method
    proxy.faults.add("POST", "/v1/agent/weights/disk", Fault("status", 500))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from aiohttp import web

FaultKind = Literal["status", "hang", "delay", "reset", "cut_after_headers", "cut_mid_body"]
_PROXY_ONLY = ("cut_after_headers", "cut_mid_body")
ANY = "*"


@dataclass
class Fault:
    kind: FaultKind
    status: int = 500
    times: int | None = None  # None: until cleared
    delay_s: float = 0.0


@dataclass
class FaultRules:
    """Rules by (method, path); `rules[path] = Fault(...)` matches any method."""

    rules: dict[tuple[str, str], Fault] = field(default_factory=dict)
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, what was done)

    def add(self, method: str, path: str, fault: Fault) -> None:
        self.rules[(method, path)] = fault

    def __setitem__(self, path: str, fault: Fault) -> None:
        self.add(ANY, path, fault)

    def clear(self) -> None:
        self.rules.clear()

    def take(self, method: str, path: str) -> Fault | None:
        """The rule for this request, if any, counting it as fired once."""
        key = next((k for k in ((method, path), (ANY, path)) if k in self.rules), None)
        if key is None:
            return None
        fault = self.rules[key]
        if fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                del self.rules[key]
        return fault

    def log(self, method: str, path: str, what: str) -> None:
        self.seen.append((method, path, what))

    def fired(self, method: str, path: str) -> list[str]:
        return [what for m, p, what in self.seen if (m, p) == (method, path) and what != "relayed"]


def injected_body(status: int) -> bytes:
    return json.dumps({"error": {"code": "injected", "message": f"injected {status} failure"}}).encode()


def fault_middleware(rules: FaultRules, on_served: Callable[[web.Request], None] | None = None) -> Any:
    """An aiohttp middleware applying `rules`; `on_served` sees every request that reached the app."""

    @web.middleware
    async def faults(request: web.Request, handler: Any) -> web.StreamResponse:
        fault = rules.take(request.method, request.path)
        if fault is not None:
            rules.log(request.method, request.path, fault.kind)
            if fault.kind == "status":
                return web.Response(
                    body=injected_body(fault.status), status=fault.status, content_type="application/json"
                )
            if fault.kind == "hang":
                await asyncio.sleep(3600)
            if fault.kind == "delay":
                await asyncio.sleep(fault.delay_s)
            if fault.kind == "reset":
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
            if fault.kind in _PROXY_ONLY:
                raise ValueError(f"fault {fault.kind!r} needs a FaultProxy")
        if on_served is not None:
            on_served(request)
        response: web.StreamResponse = await handler(request)
        return response

    return faults


@dataclass
class FaultProxy:
    """A small HTTP/1.1 proxy on loopback between a client and one server (`upstream_port`).

    Requests are relayed one at a time per client connection, each on a fresh upstream
    connection (`Connection: close`), which keeps the parsing trivial: admin answers are small
    and carry a Content-Length. The cut modes model a connection lost mid-response: the server
    did the work, the client never saw the whole answer."""

    upstream_port: int
    host: str = "127.0.0.1"
    faults: FaultRules = field(default_factory=FaultRules)

    async def start(self, port: int = 0) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, self.host, port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        self._conns: set[asyncio.Task[None]] = set()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def seen(self) -> list[tuple[str, str, str]]:
        return self.faults.seen

    def fault(
        self,
        method: str,
        path: str,
        kind: FaultKind,
        *,
        status: int = 500,
        times: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.faults.add(method, path, Fault(kind, status, times, delay_s))

    def clear(self) -> None:
        self.faults.clear()

    def fired(self, method: str, path: str) -> list[str]:
        return self.faults.fired(method, path)

    async def close(self) -> None:
        self._server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed its connection
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = [line for line in lines[1:] if line]
                length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length) if length else b""
                path = urlsplit(target).path
                fault = self.faults.take(method, path)
                if fault is not None and fault.kind == "status":
                    self.faults.log(method, path, f"status {fault.status}")
                    writer.write(_canned(fault.status))
                    await writer.drain()
                    continue
                if fault is not None and fault.kind in ("hang", "reset"):
                    self.faults.log(method, path, fault.kind)
                    if fault.kind == "hang":
                        await reader.read()  # until the client gives up
                    _reset(writer)
                    return
                if fault is not None and fault.kind == "delay":
                    self.faults.log(method, path, "delay")
                    await asyncio.sleep(fault.delay_s)
                    fault = None
                answer = await self._relay(lines[0], headers, body)
                split = answer.index(b"\r\n\r\n") + 4
                if fault is None:
                    self.faults.log(method, path, "relayed")
                    writer.write(_keep_alive(answer[:split]) + answer[split:])
                    await writer.drain()
                    continue
                cut = split if fault.kind == "cut_after_headers" else split + (len(answer) - split) // 2
                self.faults.log(method, path, fault.kind)
                writer.write(_keep_alive(answer[:split]) + answer[split:cut])
                await writer.drain()
                await asyncio.sleep(0.05)  # let the client read what it got before the reset
                _reset(writer)
                return
        finally:
            self._conns.discard(task)
            if not writer.is_closing():
                writer.close()

    async def _relay(self, request_line: str, headers: list[str], body: bytes) -> bytes:
        """One request upstream on its own connection; the whole answer (read to EOF: no deadline
        here, the client's own deadline is what a hung server must run into)."""
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        try:
            kept = [h for h in headers if not h.lower().startswith(("connection:", "keep-alive:"))]
            up_writer.write(
                ("\r\n".join([request_line, *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body
            )
            await up_writer.drain()
            return await up_reader.read(-1)
        finally:
            up_writer.close()


def _keep_alive(head: bytes) -> bytes:
    """The server answered `Connection: close` (we asked it to); the client may keep its connection."""
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join(lines)


def _canned(status: int) -> bytes:
    body = injected_body(status)
    return (
        f"HTTP/1.1 {status} Injected\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN, as a crashed peer or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

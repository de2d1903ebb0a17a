"""A small HTTP/1.1 proxy on loopback that a test puts between the controller and one agent.

It relays each request to the agent and each answer back, unless a rule for the request's
method and path says otherwise:

- `status`: answer the status itself (a JSON error body), without forwarding: a worker
  answering 500;
- `cut_after_headers`: forward, read the agent's whole answer, send the client only the
  status line and headers, then reset the connection (RST);
- `cut_mid_body`: the same after half of the body.

The cut modes model a connection lost mid-response: the agent did the work, the controller
never saw the whole answer. Requests are relayed one at a time per client connection, each on
a fresh upstream connection (`Connection: close`), which keeps the parsing trivial: admin
answers are small and carry a Content-Length. Every request is logged in `seen` with what the
proxy did, so a test can check that a fault really fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

FaultKind = Literal["status", "cut_after_headers", "cut_mid_body"]


@dataclass
class Rule:
    kind: FaultKind
    status: int = 500
    times: int | None = None  # None: until cleared


@dataclass
class FaultProxy:
    upstream_port: int
    host: str = "127.0.0.1"
    rules: dict[tuple[str, str], Rule] = field(default_factory=dict)
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, what the proxy did)

    async def start(self, port: int = 0) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, self.host, port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        self._conns: set[asyncio.Task[None]] = set()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        self._server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()

    def fault(self, method: str, path: str, kind: FaultKind, *, status: int = 500, times: int | None = None) -> None:
        self.rules[(method, path)] = Rule(kind, status, times)

    def clear(self) -> None:
        self.rules.clear()

    def fired(self, method: str, path: str) -> list[str]:
        return [what for m, p, what in self.seen if (m, p) == (method, path) and what != "relayed"]

    def _take(self, method: str, path: str) -> Rule | None:
        rule = self.rules.get((method, path))
        if rule is not None and rule.times is not None:
            rule.times -= 1
            if rule.times <= 0:
                del self.rules[(method, path)]
        return rule

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
                length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")),
                              0)
                body = await reader.readexactly(length) if length else b""
                path = urlsplit(target).path
                rule = self._take(method, path)
                if rule is not None and rule.kind == "status":
                    self.seen.append((method, path, f"status {rule.status}"))
                    writer.write(_canned(rule.status))
                    await writer.drain()
                    continue
                answer = await self._relay(lines[0], headers, body)
                split = answer.index(b"\r\n\r\n") + 4
                if rule is None:
                    self.seen.append((method, path, "relayed"))
                    writer.write(_keep_alive(answer[:split]) + answer[split:])
                    await writer.drain()
                    continue
                cut = split if rule.kind == "cut_after_headers" else split + (len(answer) - split) // 2
                self.seen.append((method, path, rule.kind))
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
        here, the controller's own deadline is what a hung agent must run into)."""
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        try:
            kept = [h for h in headers if not h.lower().startswith(("connection:", "keep-alive:"))]
            up_writer.write(("\r\n".join([request_line, *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")
                            + body)
            await up_writer.drain()
            return await up_reader.read(-1)
        finally:
            up_writer.close()


def _keep_alive(head: bytes) -> bytes:
    """The agent answered `Connection: close` (we asked it to); the client may keep its connection."""
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join(lines)


def _canned(status: int) -> bytes:
    body = json.dumps({"error": {"code": "injected", "message": f"injected {status} by the test proxy"}}).encode()
    return (f"HTTP/1.1 {status} Injected\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN, as a crashed peer or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

"""The gateway's upstream client (`gateway/upstream.py`) against real servers on loopback:
aiohttp's, uvicorn's (what vLLM and SGLang serve with), and a plain asyncio server where a worker
must misbehave (cut an answer short, answer nothing, answer what is not HTTP). Every test runs on
asyncio's own loop and on uvloop (this folder's conftest), the two the gateway runs on.

- answers of each framing (Content-Length, chunked, until the connection closes), read whole;
- a stream handed over at its headers and read chunk by chunk, each before the worker writes the next;
- keep-alive: a connection reused, let go of once idle past the setting, never reused once the
  worker closed it (uvicorn's own keep-alive);
- a worker closing before answering, mid-answer, mid-stream; an answer that is not HTTP;
- deadlines: the connect's (a listen backlog that is full) and the request's, whole answers and streams;
- an answer given up before its end closes its connection, so the worker sees its client gone;
- the request as it goes out, and the failures as the retry table reads them.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
from aiohttp import web
from aiohttp.test_utils import TestServer

from rlcp.controlplane.gateway.retry import RetryReason, connect_failure
from rlcp.controlplane.gateway.upstream import (
    AnswerTimeout,
    BadAnswer,
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
    UpstreamPool,
)
from rlcp.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(60)
JSON = {"Content-Type": "application/json"}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def pool(**kw: float) -> UpstreamPool:
    return UpstreamPool(**({"idle_s": 30.0, "connect_s": 5.0, "total_s": 30.0} | kw))


@asynccontextmanager
async def aiohttp_worker(routes: dict[str, Any], peers: list[int] | None = None) -> AsyncIterator[str]:
    """An aiohttp server with `routes` (path -> handler); each request's client port into `peers`."""

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if peers is not None and request.transport is not None:
            peers.append(request.transport.get_extra_info("peername")[1])
        return await handler(request)

    app = web.Application(middlewares=[record])
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    async with TestServer(app) as server:
        yield str(server.make_url("")).rstrip("/")


@asynccontextmanager
async def raw_worker(handler: Handler) -> AsyncIterator[str]:
    """A plain TCP server on loopback whose every connection `handler` serves as it likes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    return head + await reader.readexactly(length)


async def json_answer(request: web.Request) -> web.Response:
    return web.json_response({"got": (await request.read()).decode()})


# -- answers and streams ---------------------------------------------------------------------------
async def test_answers_of_each_framing_are_read_whole() -> None:
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=JSON)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b'{"a": ', b"1", b"}"):
            await response.write(part)
        await response.write_eof()
        return response

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n\r\n{"b": 2}')
        writer.close()

    client, peers = pool(), []
    async with aiohttp_worker({"/length": json_answer, "/chunked": chunked}, peers) as url:
        for path, body in (("/length", b'{"got": "hi"}'), ("/chunked", b'{"a": 1}')):
            answer = await client.request(url, "POST", path, JSON, b"hi")
            assert (answer.status, answer.body, answer.content_type) == (200, body, "application/json")
            assert not answer.streamed and answer.headers["content-type"].startswith("application/json")
            answer.release()
        assert len(set(peers)) == 1 and len(client.idle(url)) == 1  # kept alive, reused
    async with raw_worker(until_close) as url:
        answer = await client.request(url, "POST", "/", {}, b"x")
        assert (answer.status, answer.body, answer.content_type) == (200, b'{"b": 2}', "application/json")
        answer.release()
        assert client.idle(url) == []  # its end was the connection's
    client.close()


async def test_a_stream_is_handed_over_at_its_headers_and_read_chunk_by_chunk() -> None:
    read = [asyncio.Event() for _ in range(3)]

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, seen in enumerate(read):
            await response.write(f"data: {i}\n\n".encode())
            await seen.wait()  # the next is written only once the client read this one
        await response.write_eof()
        return response

    client = pool()
    async with aiohttp_worker({"/v1/completions": stream}) as url:
        answer = await client.request(url, "POST", "/v1/completions", JSON, b"{}")
        assert answer.streamed and answer.status == 200 and answer.content_type == "text/event-stream"
        for i, seen in enumerate(read):
            assert await answer.read_chunk() == f"data: {i}\n\n".encode()
            seen.set()
        assert await answer.read_chunk() == b""
        answer.release()
        assert len(client.idle(url)) == 1
    client.close()


# -- keep-alive ------------------------------------------------------------------------------------
async def test_an_idle_connection_is_reused_then_let_go_of_past_the_setting() -> None:
    client, peers = pool(idle_s=0.5), []
    async with aiohttp_worker({"/": json_answer}, peers) as url:
        for _ in range(3):
            (await client.request(url, "POST", "/", {}, b"x")).release()
        assert len(set(peers)) == 1
        await wait_for(lambda: client.idle(url) == [], what="the idle connection closed past idle_s")
        (await client.request(url, "POST", "/", {}, b"x")).release()
        assert len(set(peers)) == 2  # a new one
    client.close()


@asynccontextmanager
async def uvicorn_worker(keep_alive_s: int) -> AsyncIterator[str]:
    """uvicorn (httptools, as vLLM and SGLang run it) serving a JSON answer, closing idle connections itself."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, lifespan="off", log_level="error", timeout_keep_alive=keep_alive_s
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(), name="uvicorn-worker")
    await wait_for(lambda: server.started, what="uvicorn serving")
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving


async def test_a_connection_the_worker_closed_is_never_reused() -> None:
    client = pool(idle_s=60)  # longer than the worker keeps it: the worker closes first
    async with uvicorn_worker(keep_alive_s=1) as url:
        answer = await client.request(url, "POST", "/v1/completions", JSON, b"{}")
        assert (answer.status, answer.body) == (200, b'{"ok": true}')
        answer.release()
        assert len(client.idle(url)) == 1
        await wait_for(lambda: client.idle(url) == [], what="uvicorn closing the idle connection")
        answer = await client.request(url, "POST", "/v1/completions", JSON, b"{}")
        assert answer.status == 200  # on a new connection, not the closed one
        answer.release()
    client.close()


# -- a worker that breaks off ------------------------------------------------------------------------
async def test_a_worker_closing_before_or_during_its_answer() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        path = (await read_request(reader)).split(b" ")[1]
        if path == b"/mid-body":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        elif path == b"/mid-stream":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"9\r\ndata: 0\n\n\r\n")
        elif path == b"/garbage":
            writer.write(b"SPDY/9 what\r\n\r\n")
        await writer.drain()
        writer.close()

    client = pool()
    async with raw_worker(cut) as url:
        with pytest.raises(Disconnected, match="before answering"):
            await client.request(url, "POST", "/nothing", {}, b"x")
        with pytest.raises(Disconnected, match="broke off after its headers"):
            await client.request(url, "POST", "/mid-body", {}, b"x")
        answer = await client.request(url, "POST", "/mid-stream", {}, b"x")
        assert await answer.read_chunk() == b"data: 0\n\n"  # what came before the cut is handed on
        with pytest.raises(Disconnected, match="broke off"):
            await answer.read_chunk()
        answer.release()
        with pytest.raises(BadAnswer):
            await client.request(url, "POST", "/garbage", {}, b"x")
        assert client.idle(url) == []
    client.close()


async def test_a_connection_that_answered_more_than_asked_is_not_kept() -> None:
    async def twice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb")
        await reader.read()

    client = pool()
    async with raw_worker(twice) as url:
        answer = await client.request(url, "POST", "/", {}, b"x")
        assert (answer.status, answer.body) == (200, b"a")
        answer.release()
        assert client.idle(url) == []
    client.close()


# -- deadlines ---------------------------------------------------------------------------------------
async def test_the_requests_deadline_holds_for_an_answer_and_a_stream_and_closes_the_connection() -> None:
    closed = asyncio.Event()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if b"/stream" in await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"9\r\ndata: 0\n\n\r\n")
        assert await reader.read() == b""  # nothing more: until the client closes
        closed.set()

    client = pool(total_s=0.5)
    async with raw_worker(hang) as url:
        with pytest.raises(AnswerTimeout):
            await client.request(url, "POST", "/answer", {}, b"x")
        await asyncio.wait_for(closed.wait(), 30)
        closed.clear()
        answer = await client.request(url, "POST", "/stream", {}, b"x")
        assert await answer.read_chunk() == b"data: 0\n\n"
        with pytest.raises(AnswerTimeout):
            await answer.read_chunk()
        answer.release()
        await asyncio.wait_for(closed.wait(), 30)
    client.close()


async def test_the_connect_deadline_holds_and_a_refusal_is_said_so() -> None:
    # A listening socket whose backlog is full and never accepted: the kernel drops further SYNs.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fill.append(s)
    client = pool(connect_s=0.3)
    try:
        with pytest.raises(ConnectTimeout) as timed_out:
            await client.request(f"http://127.0.0.1:{port}", "POST", "/", {}, b"x")
        assert connect_failure(timed_out.value).reason is RetryReason.FAILED  # a full backlog is not down
    finally:
        for s in (*fill, listener):
            s.close()
    with pytest.raises(ConnectFailed) as refused:  # nothing listens there any more
        await client.request(f"http://127.0.0.1:{port}", "POST", "/", {}, b"x")
    assert isinstance(refused.value.os_error, ConnectionRefusedError)
    failure = connect_failure(refused.value)
    assert failure.reason is RetryReason.UNREACHABLE and "refused the connection" in str(failure)


# -- giving up, and what goes out ----------------------------------------------------------------------
async def test_an_answer_given_up_before_its_end_closes_its_connection() -> None:
    gone = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b"data: more\n\n")
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            gone.set()
            raise

    client = pool()
    async with aiohttp_worker({"/": endless}) as url:
        answer = await client.request(url, "POST", "/", {}, b"x")
        assert (await answer.read_chunk()).startswith(b"data: more")
        answer.release()
        await asyncio.wait_for(gone.wait(), 30)
        assert client.idle(url) == []
    client.close()


async def test_the_request_goes_out_as_given_in_one_piece() -> None:
    seen: list[bytes] = []

    async def capture(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    client = pool()
    async with raw_worker(capture) as url:
        headers = {"Content-Type": "application/json", "X-Request-ID": "r-1"}
        answer = await client.request(url + "/prefix", "POST", "/v1/completions?x=1", headers, b'{"p": 1}')
        assert answer.status == 204 and answer.body == b""
        answer.release()
    host = url.removeprefix("http://")
    assert seen == [
        b"POST /prefix/v1/completions?x=1 HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Length: 8\r\n"
        b'Content-Type: application/json\r\nX-Request-ID: r-1\r\n\r\n{"p": 1}'
    ]
    client.close()

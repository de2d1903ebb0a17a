"""`rlcp.core.deadline.timeout`: a held event loop is not counted against a call, and a call that
gets no answer still times out. The loop is held on purpose (`time.sleep` in a callback), and an
answer comes in while it is held, so each case is certain whatever the machine's speed."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager

import aiohttp
import pytest

from rlcp.controlplane.workers.transport import CallPolicy, HttpTransport, WorkerTimeout
from rlcp.core import deadline

DEADLINE_S = 0.2
HOLD_S = 1.0  # the loop held past the deadline: five deadlines


def hold_the_loop_soon(loop: asyncio.AbstractEventLoop, answer: Callable[[], None] | None = None) -> None:
    """Once the call is under way, the loop runs nothing for HOLD_S (a long callback, a GC pause,
    a process the kernel did not schedule). `answer` comes from another thread during the hold, as
    a worker's bytes reach the socket while nobody reads them: it is queued on the loop before the
    hold ends, and so before the deadline's timer, due by then, is run."""
    delivered = threading.Event()

    def deliver() -> None:
        assert answer is not None
        loop.call_soon_threadsafe(answer)
        delivered.set()

    def hold() -> None:
        if answer is not None:
            threading.Thread(target=deliver).start()
            delivered.wait()
        time.sleep(HOLD_S)

    loop.call_later(0.01, hold)


async def answered_in_time(limit: Callable[[float], AbstractAsyncContextManager[object]]) -> str:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()
    hold_the_loop_soon(loop, lambda: answer.set_result("answer"))
    async with limit(DEADLINE_S):
        return await answer


async def test_an_answer_that_came_while_the_loop_was_held_is_taken():
    assert await answered_in_time(deadline.timeout) == "answer"


async def test_asyncio_timeout_fails_the_same_call_the_premise():
    # What `deadline.timeout` is for: the plain timeout blames the call for the loop's hold.
    with pytest.raises(TimeoutError):
        await answered_in_time(asyncio.timeout)


async def test_a_call_that_gets_no_answer_still_times_out_held_loop_or_not():
    loop = asyncio.get_running_loop()
    hold_the_loop_soon(loop)
    with pytest.raises(TimeoutError):
        async with deadline.timeout(DEADLINE_S):
            await loop.create_future()  # never answered
    with pytest.raises(TimeoutError):
        async with deadline.timeout(DEADLINE_S):
            await loop.create_future()


class _AnswersDuringAHold(http.server.BaseHTTPRequestHandler):
    """Holds the caller's loop once the request is here, and answers while it is held."""

    loop: asyncio.AbstractEventLoop

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        holding = threading.Event()

        def hold() -> None:
            holding.set()
            time.sleep(HOLD_S)

        self.loop.call_soon_threadsafe(hold)
        holding.wait()
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
async def worker() -> AsyncIterator[str]:
    """A worker in a thread of its own: it answers while the test's loop is held."""
    handler = type("Handler", (_AnswersDuringAHold,), {"loop": asyncio.get_running_loop()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_worker() -> Iterator[str]:
    """A worker that accepts the connection and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def transport(session: aiohttp.ClientSession, url: str) -> HttpTransport:
    policy = CallPolicy(timeout_s=DEADLINE_S, attempts=1)
    return HttpTransport(session=session, worker_id="w0", base_url=url, token=None, policy=policy)


async def test_a_worker_call_answered_while_the_controllers_loop_was_held_succeeds(worker):
    async with aiohttp.ClientSession() as session:
        assert await transport(session, worker).request("GET", "/v1/agent/state") == {"ok": True}


async def test_a_worker_that_never_answers_still_times_out(silent_worker):
    async with aiohttp.ClientSession() as session:
        hold_the_loop_soon(asyncio.get_running_loop())
        with pytest.raises(WorkerTimeout, match="did not answer within 0.2s"):
            await transport(session, silent_worker).request("GET", "/v1/agent/state")

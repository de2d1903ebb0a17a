"""Servers on an event loop of their own thread, for tests whose client is synchronous
(schemathesis, hypothesis' `@given`): the servers run there, the test thread calls them over
HTTP and, through `LiveLoop.run`, reads their state on their own loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

from aiohttp import web


class LiveLoop:
    """An event loop in a thread: the servers run there, the test thread calls them over HTTP."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-servers", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` on 127.0.0.1, a port of its own: (runner, base URL)."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

"""Discovery from an sglang-router's worker list (`http_listing` with `format: sglang_router`),
against the real sglang-router 0.3.2 (`python -m sglang_router.launch_router`, the bench extra),
started by this test on loopback.

slime and Miles register each SGLang server they start with their router
(`POST {router}/workers {url, worker_type}`) and take it out again on shutdown (`GET /workers`,
then `DELETE /workers/{id}`): this test does the same through the router's own routes. The
workers are small aiohttp stand-ins for SGLang servers, answering only what the router reads
when a worker is added (`/health`, `/server_info`, `/model_info`); nothing here claims anything
of SGLang's server itself (tests/controlplane/workers/flavors/sglang/ runs it). Checked: the controller's
discovery finds both workers as members of flavor `sglang` (URL as id, admin and inference URL,
TP size as `world_size`, the router's model id); a worker removed from the router leaves the
membership; a router that stops answering keeps the last membership, and a poll of it fails with
a clear error within its deadline; a URL that is not the router's worker list is a clear error.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rlcp.controlplane.discovery.http_listing import HttpListingSource, ListingError
from rlcp.harness.controller import start_controller
from rlcp.harness.http import call, free_port
from rlcp.harness.procfs import thread_states
from rlcp.harness.servers import HttpServerProcess
from rlcp.harness.waiting import wait_for


class SglangRouter(HttpServerProcess):
    """sglang-router on loopback with no workers, as slime starts it before its engines."""

    ready_path = "/liveness"
    ready_poll_s = 0.1

    def __init__(self, workdir: Path) -> None:
        super().__init__({}, workdir, name="sglang-router", start_timeout_s=60.0, stop_timeout_s=10.0)
        self.port, self.metrics_port = free_port(), free_port()

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            *self.listen_args(),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--log-level",
            "warn",
        ]


def stand_in(model: str, tp_size: int) -> web.Application:
    """What the router reads from an SGLang server when it is added (seen against the binary)."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": model, "tp_size": tp_size, "dp_size": 1})

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": model, "is_generation": True})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/model_info", model_info)
    return app


@pytest.fixture
async def servers() -> AsyncIterator[list[str]]:
    # The router first tries HTTP/2 on a new worker; aiohttp answers that 400 and logs a traceback.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    runners, urls = [], []
    for i, tp in enumerate((1, 2)):
        runner = web.AppRunner(stand_in(f"/models/m{i}", tp), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    yield urls
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def router(tmp_path: Path) -> Any:
    r = SglangRouter(tmp_path).spawn()
    try:
        yield r.wait_ready()
    finally:
        r.stop()


async def _listed(http: aiohttp.ClientSession, router_url: str) -> list[dict[str, Any]]:
    status, body = await call(http, "GET", f"{router_url}/workers", timeout_s=5)
    assert status == 200, body
    workers: list[dict[str, Any]] = body["workers"]
    return workers


async def test_controller_finds_the_router_workers_and_follows_removals(
    router: SglangRouter, servers: list[str], tmp_path: Path
) -> None:
    listing = {
        "url": f"{router.url}/workers",
        "format": "sglang_router",
        "interval_s": 0.2,
        "timeout_s": 1.0,
    }
    ctl = await start_controller(tmp_path, [], discovery={"kind": "http_listing", "http_listing": listing})
    try:
        async with aiohttp.ClientSession() as http:
            for url in servers:  # as slime's SGLangEngine._register_to_router does
                status, body = await call(
                    http, "POST", f"{router.url}/workers", body={"url": url, "worker_type": "regular"}, timeout_s=5
                )
                assert status == 202, body  # the router adds it in the background

            async def both() -> dict[str, Any] | None:
                state = await ctl.state()
                return state if sorted(w["id"] for w in state["workers"]) == sorted(servers) else None

            state = await wait_for(both, 20, "both router workers members")
            workers = {w["id"]: w for w in state["workers"]}
            for i, url in enumerate(servers):
                w = workers[url]
                assert (w["admin_url"], w["inference_url"], w["flavor"]) == (url, url, "sglang")
                assert w["world_size"] == i + 1  # the stand-ins' tp_size, as the router read it
                assert w["labels"] == {"worker_type": "regular"}
            epoch = state["membership_epoch"]

            # Taken out as slime's shutdown does: find the router's id by URL, DELETE it.
            gone = next(w["id"] for w in await _listed(http, router.url) if w["url"] == servers[0])
            status, body = await call(http, "DELETE", f"{router.url}/workers/{gone}", timeout_s=5)
            assert status in (200, 202), body

            async def one_left() -> dict[str, Any] | None:
                state = await ctl.state()
                return state if [w["id"] for w in state["workers"]] == [servers[1]] else None

            state = await wait_for(one_left, 20, "the removed worker out of the membership")
            assert state["membership_epoch"] > epoch
            epoch = state["membership_epoch"]

            # The router stops answering: polls fail within their deadline, the membership stays.
            assert router.signal_group(signal.SIGSTOP)  # stopped, not gone: connections hang
            try:
                # A group stop reaches each of the router's threads on its own (a busy one at its
                # next kernel entry): poll only once every thread is stopped, or one still running
                # may answer (a fresh-clone run got an answer here).
                await wait_for(lambda: set(thread_states(router.pid)) == {"T"}, 20, "every router thread stopped")
                source = HttpListingSource(session=http, url=listing["url"], format="sglang_router", timeout_s=0.5)
                with pytest.raises(ListingError, match="no answer within 0.5s"):
                    await source.poll()
                await asyncio.sleep(3.0)  # the controller's polls: a 1 s deadline, then 0.4 s and 0.8 s of backoff
                state = await ctl.state()
                assert [w["id"] for w in state["workers"]] == [servers[1]]
                assert state["membership_epoch"] == epoch and state["discovery_synced"]
            finally:
                router.signal_group(signal.SIGCONT)

            # The router's base URL is not its worker list: a clear error, not an empty fleet.
            wrong = HttpListingSource(session=http, url=router.url, format="sglang_router", timeout_s=2)
            with pytest.raises(ListingError, match="HTTP 404"):
                await wrong.poll()
    finally:
        await ctl.client.close()

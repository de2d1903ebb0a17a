"""Serve an aiohttp app on a host and port: the admin port, and a simulated engine's inference port."""

from __future__ import annotations

from aiohttp import web


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve `app`; returns its runner (to clean up) and the bound port (`port` 0 picks a free one)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound: int = runner.addresses[0][1]
    return runner, bound

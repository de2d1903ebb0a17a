"""The daemon with a front: start the core, follow it, serve the public port, stop both.

The core is `python -m rlcp.controlplane --core` with the same settings (file and environment),
except its API, which listens on a loopback port it picks and writes to a file. Its stdin is
a pipe from this process: when the front goes, however it goes (a SIGKILL included), the
pipe closes and the core stops cleanly (hands its Lease back), so no orphaned core keeps
driving the fleet. Closing that pipe is also how the front stops the core (it sends no signal
of its own). When the core exits, the front exits with it, and the pod restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from rlcp.controlplane.front.app import CoreLink, build_front
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.follow import FollowedDocument
from rlcp.core.heap import settle

log = structlog.get_logger("rlcp.controlplane.front")


class CoreStartFailed(RuntimeError):
    pass


class CoreProcess:
    def __init__(self, config: Path | None, *, start_timeout_s: float, stop_timeout_s: float) -> None:
        self._config = config
        self._start_timeout_s, self._stop_timeout_s = start_timeout_s, stop_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="rlcp-core-")
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> str:
        """Start the core; its URL once it serves."""
        port_file = Path(self._tmp.name) / "core.port"
        env = {**os.environ, "RLCP_API__HOST": "127.0.0.1", "RLCP_API__PORT": "0"}
        argv = [sys.executable, "-m", "rlcp.controlplane", "--core", "--port-file", str(port_file)]
        if self._config is not None:
            argv += ["--config", str(self._config)]
        self.proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.PIPE)
        deadline = time.monotonic() + self._start_timeout_s
        while not port_file.exists():
            if self.proc.returncode is not None:
                raise CoreStartFailed(f"the controller core exited with {self.proc.returncode} before serving")
            if time.monotonic() > deadline:
                await self.stop()
                raise CoreStartFailed(f"the controller core did not serve within {self._start_timeout_s:g}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 0.05)
        return f"http://127.0.0.1:{int(port_file.read_text())}"

    async def wait(self) -> int:
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self) -> None:
        """Ask the core to stop by closing its stdin, then kill it after `stop_timeout_s`. Not a
        SIGTERM: a signal to the process group may have reached the core already, and a second
        one while it stops is one more thing its stop must survive (a Ray driver's did not,
        issue 33); a closed pipe is the same request however often it is made."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
            except TimeoutError:
                log.warning("core_stop_timeout", timeout_s=self._stop_timeout_s)
                proc.kill()
                await proc.wait()
        self._tmp.cleanup()


def write_port_file(path: Path | None, port: int) -> None:
    """The bound port, for whoever started this process (`--port-file`); written atomically."""
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.replace(path)


async def serve(
    settings: ControllerSettings, *, token: str, config: Path | None, port_file: Path | None, stop: asyncio.Event
) -> int:
    """Run the core and the front until `stop` is set or the core exits; the exit code."""
    api = settings.api
    core = CoreProcess(config, start_timeout_s=api.core_start_timeout_s, stop_timeout_s=api.core_stop_timeout_s)
    url = await core.start()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        replica = FollowedDocument(
            session=session,
            url=url + "/v1/rl/state",
            token=token if api.auth_reads else None,
            interval_s=api.front_follow_interval_s,
            timeout_s=settings.workers.timeout_s,
        )
        await replica.refresh()
        follower = asyncio.create_task(replica.run(), name="follow-core-state")
        app = build_front(
            settings,
            token=token,
            core=CoreLink(url=url, session=session, timeout_s=api.front_timeout_s),
            replica=replica,
        )
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, api.host, api.port)
            await site.start()
            port = runner.addresses[0][1]
            write_port_file(port_file, port)
            frozen = settle()  # startup's heap, out of the collector's sight (rlcp/core/heap.py)
            log.info("controller_ready", port=port, core=url, heap_frozen=frozen)
            exited = asyncio.create_task(core.wait(), name="core-exit")
            stopped = asyncio.create_task(stop.wait(), name="stop")
            await asyncio.wait({exited, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (exited, stopped):
                task.cancel()
            if stop.is_set() or not exited.done():
                return 0  # asked to stop (a signal to the process group reaches the core as well)
            log.error("core_exited", code=exited.result())
            return exited.result() or 1
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await runner.cleanup()
            await core.stop()

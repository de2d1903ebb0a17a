"""Test harness: run real agents as subprocesses, exactly as `rl-agent` runs in production.

An agent is started with `python -m agents --config <yaml> --ports-file <json>` on
port 0 and the harness reads the bound ports back, so tests never race for ports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent


class ChildProcess:
    """What the harness does with any child it starts in its own session (`proc`, `log_path`):
    wait for the file it writes once serving, stop it, kill its whole group, read its log."""

    proc: subprocess.Popen | None
    log_path: Path
    stop_timeout_s = 30.0

    def wait_for_file(self, path: Path, timeout_s: float, what: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{what} not ready in {timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout_s: float | None = None) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s or self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its children (the engine's) too
            self.proc.wait(timeout=10)


@dataclass
class AgentProcess(ChildProcess):
    config: dict[str, Any]
    workdir: Path
    token: str = "test-token"
    start_timeout_s: float = 180.0
    proc: subprocess.Popen | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['admin_port']}"

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['inference_port']}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start(self) -> AgentProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "agent.yaml"
        ports_file = self.workdir / "ports.json"
        ports_file.unlink(missing_ok=True)
        settings = {"admin": {"port": 0, "token": self.token}, "inference": {"port": 0}, **self.config}
        config_path.write_text(yaml.safe_dump(settings))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        self.log_path = self.workdir / "agent.log"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "agents", "--config", str(config_path),
                                      "--ports-file", str(ports_file)],
                                     cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.wait_for_file(ports_file, self.start_timeout_s, "agent")
        self.ports = json.loads(ports_file.read_text())
        return self


async def call(session: Any, method: str, url: str, *, body: Any = None, headers: dict | None = None,
               data: bytes | None = None, timeout_s: float = 120.0) -> tuple[int, Any]:
    """One HTTP call with a deadline; returns (status, parsed JSON body or text)."""
    import aiohttp

    async with session.request(method, url, json=body, data=data, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text

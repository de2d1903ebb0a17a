"""A fleet of real agents on SimEngine, hosted in a few subprocesses (`bench.agent_host`).

The benchmark's driver (controller, load generator, baselines) runs in its own process,
so the agents' CPU is not charged to what is measured, and every call crosses a real
loopback TCP connection as it would in a cluster.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from bench.agent_host import TOKEN
from bench.common import REPO

__all__ = ["TOKEN", "HostedFleet", "write_checkpoint"]


def write_checkpoint(directory: Path, seed: int) -> Path:
    """A small real safetensors checkpoint (SimEngine digests its bytes)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    save_file({"model.embed.weight": rng.standard_normal((8, 4)).astype(np.float32)},
              str(directory / "model.safetensors"))
    return directory


@dataclass
class Agent:
    id: str
    url: str

    def spec(self) -> dict:
        return {"id": self.id, "admin_url": self.url, "flavor": "agent"}


class HostedFleet:
    """`count` agents over `hosts` processes; a context manager that stops them all."""

    def __init__(self, count: int, *, root: Path, latency_s: float, hosts: int = 2,
                 start_timeout_s: float = 300.0) -> None:
        self.count, self.root, self.latency_s = count, root, latency_s
        self.hosts = max(1, min(hosts, count))
        self.start_timeout_s = start_timeout_s
        self.procs: list[subprocess.Popen] = []
        self.agents: list[Agent] = []
        self._dir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))

    def __enter__(self) -> HostedFleet:
        per, extra = divmod(self.count, self.hosts)
        first, ready = 0, []
        for h in range(self.hosts):
            n = per + (1 if h < extra else 0)
            path = self._dir / f"host-{h}.json"
            ready.append(path)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "bench.agent_host", "--count", str(n), "--first", str(first),
                 "--root", str(self.root), "--latency-s", str(self.latency_s), "--ready", str(path)],
                cwd=REPO, stdin=subprocess.PIPE))
            first += n
        deadline = time.monotonic() + self.start_timeout_s
        per_host: list[list[Agent]] = []
        for path, proc in zip(ready, self.procs):
            while not path.exists():
                if proc.poll() is not None:
                    self.__exit__()
                    raise RuntimeError(f"agent host exited with {proc.returncode} while starting")
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"agent hosts did not start within {self.start_timeout_s:g}s")
                time.sleep(0.1)
            info = json.loads(path.read_text())
            per_host.append([Agent(f"w{info['first'] + i:05d}", f"http://127.0.0.1:{port}")
                             for i, port in enumerate(info["ports"])])
        # Round-robin over the hosts, so the first N agents (a smaller fleet) use them all.
        self.agents = [a for group in itertools.zip_longest(*per_host) for a in group if a is not None]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.close()  # the host's signal to stop
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []

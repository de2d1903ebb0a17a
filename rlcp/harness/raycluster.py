"""A real Ray head for tests and measurements, on loopback only.

`ray start --head --block` in a session of its own, every port it opens chosen here and bound
to 127.0.0.1 (docs/ray.md, /work/shared/TESTING.md "Ray on these machines"):
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps Ray from rewriting the node address to the
machine's own, and `AUTOSCALER_METRIC_PORT` / `DASHBOARD_METRIC_PORT` move the two metric
listeners that are otherwise fixed. Stopping kills the process group and then any process
left whose command line names this head's own temp dir (Ray's workers start sessions of their
own), each by pid: `ray stop` would stop every Ray on the machine.

This module runs the `ray` CLI and never imports `ray`; a test drives the cluster with
`ray.init(address=head.gcs_address, namespace=...)`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcp.harness.http import free_port
from rlcp.harness.waiting import wait_for_sync

RAY = Path(sys.executable).with_name("ray")
WORKER_PORTS = 40  # the range workers (actors) listen in; one port each


def _dashboard_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/v0/actors?limit=1", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _free_range(size: int) -> int:
    """The first port of `size` consecutive ports free on 127.0.0.1 right now, below the kernel's
    ephemeral range (32768 up on Linux), where outgoing connections would keep taking ports."""
    for _ in range(100):
        first = random.randrange(20000, 32000 - size)
        socks: list[socket.socket] = []
        try:
            for p in range(first, first + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return first
    raise RuntimeError(f"no {size} consecutive free ports on 127.0.0.1")


@dataclass
class RayHead:
    num_cpus: int = 2
    num_gpus: int = 0  # logical GPUs: Ray schedules them and sets CUDA_VISIBLE_DEVICES, no device needed
    temp_dir: Path | None = None  # default: a short dir under /tmp (Ray's socket paths are length-bound)
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.ports['port']}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['dashboard-port']}"

    def start(self, *, timeout_s: float = 60.0) -> RayHead:
        names = (
            "port",
            "object-manager-port",
            "node-manager-port",
            "ray-client-server-port",
            "dashboard-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
        taken: set[int] = set()
        for name in (*names, "autoscaler-metric", "dashboard-metric"):
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            self.ports[name] = port
        workers = _free_range(WORKER_PORTS)
        if self.temp_dir is None:
            self.temp_dir = Path(tempfile.mkdtemp(prefix="rlcp-ray-", dir="/tmp"))
        env = {
            **os.environ,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "AUTOSCALER_METRIC_PORT": str(self.ports["autoscaler-metric"]),
            "DASHBOARD_METRIC_PORT": str(self.ports["dashboard-metric"]),
        }
        cmd = [
            str(RAY),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={self.num_gpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            f"--min-worker-port={workers}",
            f"--max-worker-port={workers + WORKER_PORTS - 1}",
            *(f"--{name}={self.ports[name]}" for name in names),
        ]
        self.log_path = self.temp_dir / "ray-start.log"
        with self.log_path.open("wb") as log:
            self.process = process = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        try:
            wait_for_sync(
                lambda: process.poll() is not None or _dashboard_up(self.dashboard_url),
                timeout_s=timeout_s,
                what="the Ray dashboard's state API",
                interval_s=0.2,
            )
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited {self.process.returncode}: {self.log_path.read_text()[-2000:]}")
        except BaseException:
            self.stop()
            raise
        return self

    def pids(self) -> list[int]:
        """Every live process of this head: `ray start` and its descendants, and any process whose
        command line names this head's own temp dir (a worker that left the process tree)."""
        marker = str(self.temp_dir).encode()
        parents: dict[int, int] = {}
        found: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
                if marker in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
        if self.process is not None and self.process.poll() is None:
            found.add(self.process.pid)
        grown = True
        while grown:
            more = {pid for pid, parent in parents.items() if parent in found} - found
            found |= more
            grown = bool(more)
        return sorted(found)

    def _state_rows(self, resource: str, query: str = "") -> list[dict[str, Any]]:
        url = f"{self.dashboard_url}/api/v0/{resource}?detail=true&limit=1000{query}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return list(json.load(resp)["data"]["result"]["result"])

    def actors(self, namespace: str, prefix: str) -> dict[str, dict[str, Any]]:
        """Named actors of `namespace` whose name starts with `prefix`, alive or restarting, by name
        (the dashboard's state API rows: pid, state, num_restarts, repr_name, ...)."""
        rows = self._state_rows("actors", f"&filter_keys=ray_namespace&filter_predicates=%3D&filter_values={namespace}")
        return {r["name"]: r for r in rows if r.get("name", "").startswith(prefix) and r["state"] != "DEAD"}

    def placement_groups(self, prefix: str) -> list[str]:
        """Names of the placement groups starting with `prefix` that are not removed."""
        return sorted(
            r["name"]
            for r in self._state_rows("placement_groups")
            if r.get("name", "").startswith(prefix) and r["state"] != "REMOVED"
        )

    def remove_named(self, namespace: str, prefix: str, *, timeout_s: float = 60.0) -> None:
        """Kill the named actors of `namespace` and remove the placement groups whose names start
        with `prefix`, from a Ray driver of its own (a child process: this module never imports
        `ray`). For a test that found leftovers and must start the next case clean."""
        script = (
            "import sys, ray\n"
            "address, namespace, prefix = sys.argv[1:4]\n"
            "ray.init(address=address, namespace=namespace, logging_level='error', log_to_driver=False)\n"
            "for entry in ray.util.list_named_actors(all_namespaces=True):\n"
            "    if entry['namespace'] == namespace and entry['name'].startswith(prefix):\n"
            "        ray.kill(ray.get_actor(entry['name'], namespace=namespace), no_restart=True)\n"
            "for info in ray.util.placement_group_table().values():\n"
            "    if info.get('state') != 'REMOVED' and (info.get('name') or '').startswith(prefix):\n"
            "        try:\n"
            "            ray.util.remove_placement_group(ray.util.get_placement_group(info['name']))\n"
            "        except ValueError:\n"
            "            pass\n"
            "ray.shutdown()\n"
        )
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        subprocess.run(
            [sys.executable, "-c", script, self.gcs_address, namespace, prefix],
            env=env,
            check=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )

    def listeners(self) -> list[tuple[str, int]]:
        """(address, port) of every TCP socket this head's processes listen on (`ss -ltnp`)."""
        pids = {str(p) for p in self.pids()}
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=True).stdout
        found = []
        for line in out.splitlines():
            fields = line.split()
            if len(fields) < 6 or not any(f"pid={p}," in fields[5] for p in pids):
                continue
            address, _, port = fields[3].rpartition(":")
            found.append((address, int(port)))
        return sorted(found)

    def stop(self, *, grace_s: float = 5.0) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)  # `ray start --block` stops its children on TERM
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=grace_s)
        deadline = time.monotonic() + grace_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.pids():  # workers in sessions of their own, still running: by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.temp_dir is not None and self.temp_dir.name.startswith("rlcp-ray-"):
            shutil.rmtree(self.temp_dir, ignore_errors=True)

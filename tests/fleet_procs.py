"""Real processes for fault tests: the controller (`python -m controlplane`) and SimEngine agents
(`python -m agents`), each started as production starts it, so a test can SIGKILL, SIGSTOP or
restart one and watch the others from outside.

Agents use `tests.harness.AgentProcess`; this module adds the controller process, a fleet of
sim agents on fixed admin ports (a restarted agent comes back on the same address, as a pod
behind a stable Service would), counting disk loads from the agents' JSON logs, and a place
for the tests' figures (`bench/out/`, gitignored).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.harness import REPO, AgentProcess, ChildProcess
from tests.sim_fleet import TOKEN as AGENT_TOKEN
from tests.sim_fleet import free_port

CTL_TOKEN = "ctl-token"
CTL_AUTH = {"Authorization": f"Bearer {CTL_TOKEN}"}
FIGURES_DIR = REPO / "bench" / "out"


@dataclass
class ControllerProcess(ChildProcess):
    """`python -m controlplane --config <yaml> --port-file <file>` on a port it picks."""

    config: dict[str, Any]
    workdir: Path
    start_timeout_s: float = 60.0
    proc: subprocess.Popen | None = None
    port: int = 0
    log_path: Path = field(init=False)
    stop_timeout_s = 15.0

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "controller.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path, self._port_file = self.workdir / "controller.yaml", self.workdir / "controller.port"
        self._port_file.unlink(missing_ok=True)
        config_path.write_text(yaml.safe_dump(self.config))
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "controlplane", "--config", str(config_path),
                                          "--port-file", str(self._port_file)], cwd=REPO, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self) -> ControllerProcess:
        self.wait_for_file(self._port_file, self.start_timeout_s, "controller")
        self.port = int(self._port_file.read_text())
        return self

    def start(self) -> ControllerProcess:
        self.spawn()
        return self.wait_ready()


def sim_agent(agent_id: str, workdir: Path, roots: list[Path], *, op_latency_s: float = 0.05,
              admin_port: int | None = None) -> AgentProcess:
    """A SimEngine agent configured as a controller-managed pod: not ready until told the
    desired version, JSON logs (so loads can be counted), short engine deadlines."""
    config = {
        "agent_id": agent_id, "allowed_roots": [str(r) for r in roots], "log_format": "json",
        "require_desired_version": True,
        "admin": {"port": admin_port or free_port(), "token": AGENT_TOKEN},
        "engine": {"kind": "sim", "model": "sim", "sim_op_latency_s": op_latency_s},
        "timeouts": {"pause_s": 30, "control_s": 10, "weight_load_s": 30},
    }
    return AgentProcess(config, workdir / agent_id, token=AGENT_TOKEN, start_timeout_s=60)


def admin_port(agent: AgentProcess) -> int:
    return int(agent.config["admin"]["port"])


def controller_config(workdir: Path, workers: list[dict[str, Any]], roots: list[Path], **overrides: Any) -> dict:
    """Short deadlines and a fast reconciler, so faults resolve in seconds; the desired state
    in a file under `workdir`, which survives a controller restart."""
    config: dict[str, Any] = {
        "controller_id": "faults", "api": {"host": "127.0.0.1", "port": 0, "token": CTL_TOKEN},
        "discovery": {"kind": "static", "static": workers},
        "workers": {"token": AGENT_TOKEN, "timeout_s": 3, "attempts": 3, "retry_budget_s": 10,
                    "pause_timeout_s": 10, "weight_load_timeout_s": 20},
        "reconcile": {"poll_interval_s": 0.2, "interval_s": 0.2, "backoff_initial_s": 0.2, "backoff_max_s": 1.0},
        "store": {"kind": "file", "path": str(workdir / "store" / "desired.json")},
        "allowed_roots": [str(r) for r in roots], "log_format": "json", "log_level": "info",
    }
    for key, value in overrides.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and isinstance(config.get(key), dict) \
            else value
    return config


def start_processes(agents: list[AgentProcess], controller: ControllerProcess | None = None) -> None:
    """Start everything at once (each start mostly waits for imports): the agents in threads,
    the controller spawned alongside and waited for last."""
    from concurrent.futures import ThreadPoolExecutor

    if controller is not None:
        controller.spawn()
    with ThreadPoolExecutor(max_workers=max(1, len(agents))) as pool:
        for future in [pool.submit(a.start) for a in agents]:
            future.result()
    if controller is not None:
        controller.wait_ready()


def disk_loads(agent: AgentProcess) -> Counter[str]:
    """Versions this agent loaded from disk (successful `update_weights_from_disk` operations),
    over every process start: read from its JSON log, which restarts append to."""
    loads: Counter[str] = Counter()
    for line in agent.log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if (rec.get("event") == "operation" and rec.get("operation") == "update_weights_from_disk"
                and rec.get("status") == "ok"):
            loads[rec["version"]] += 1
    return loads


async def get_json(session: aiohttp.ClientSession, url: str, *, timeout_s: float = 10.0,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        body = await resp.read()
        try:
            return resp.status, json.loads(body)
        except ValueError:
            return resp.status, body.decode(errors="replace")


async def wait_until(probe, *, timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll `probe` (sync or async) until it returns something truthy; return that. Connection
    errors count as "not yet": the thing polled may be restarting."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
        except (aiohttp.ClientError, TimeoutError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}"
                                 + (f" (last error: {last_error!r})" if last_error else ""))
        await asyncio.sleep(interval_s)


def record_figures(name: str, key: str, figures: dict[str, Any]) -> Path:
    """Merge `figures` under `key` into bench/out/<name>.json and print them (pytest -s shows them)."""
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    path = FIGURES_DIR / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = figures
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
    print(f"\n[{name}] {key}: {json.dumps(figures, sort_keys=True)}")
    return path

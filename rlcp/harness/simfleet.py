"""Fleets of real agents on SimEngine, on loopback: the agent's own code (service, admin app,
deadlines), only the engine simulated.

- `SimAgent`: one agent served from this process's event loop, with fault rules in front of it
  (`rlcp.harness.faults`) and a record of every mutating call that reached it, so a test can assert
  that a refused request touched no worker. `start_fleet` starts n of them.
- `python -m rlcp.harness.simfleet --count N ...`: a host process serving N agents, one port each, for
  fleets of a thousand on two cores; `HostedFleet` starts a few hosts and stops them.
- `sim_agent_process`: a SimEngine agent as its own process (`python -m rlcp.agent`), configured as a
  controller-managed pod, for tests that kill and restart agents.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from rlcp.agent.admin.app import build_admin_app
from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.engine.sim_inference import build_sim_inference_app
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings
from rlcp.core.heap import settle
from rlcp.harness.faults import FaultRules, fault_middleware
from rlcp.harness.http import free_port
from rlcp.harness.processes import REPO, AgentProcess
from rlcp.harness.waiting import wait_for_sync

TOKEN = "agent-token"
# POSTs that change nothing on the agent (the checkpoint check an update makes before pausing
# anyone): not counted in `touched`, which tests read as "a mutating call reached this worker".
CHANGES_NOTHING = frozenset({"POST /v1/agent/weights/check"})
# Short engine deadlines, so a test's hang costs seconds.
TEST_TIMEOUTS = {"pause_s": 30, "control_s": 10, "weight_load_s": 30}


@dataclass
class SimAgent:
    agent_id: str
    roots: list[Path]
    port: int = 0  # bound at the first start, kept across restarts
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    settings_overrides: dict[str, Any] = field(default_factory=dict)
    faults: FaultRules = field(default_factory=FaultRules)
    inference_faults: FaultRules = field(default_factory=FaultRules)  # on the OpenAI port
    touched: list[str] = field(default_factory=list)
    # (call, X-Request-ID, traceparent) of every request that reached the agent, reads too.
    traced: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    backlog: int = 128
    serve_inference: bool = False  # also the sim engine's OpenAI port (`rlcp.agent.engine.sim_inference`)
    inference_port: int = 0  # bound at the first start, kept across restarts
    model: str = "sim"  # the base model's name, as clients send it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spec(self) -> dict[str, Any]:
        spec = {"id": self.agent_id, "admin_url": self.url, "flavor": "agent"}
        if self.serve_inference:
            spec["inference_url"] = f"http://127.0.0.1:{self.inference_port}"
        return spec

    async def start(self) -> SimAgent:
        self.engine = SimEngine(model_name=self.model, **self.engine_kwargs)
        await self.engine.start()
        settings = AgentSettings(
            **(
                {
                    "agent_id": self.agent_id,
                    "engine": {"kind": "sim", "model": self.model},
                    "allowed_roots": self.roots,
                    "admin": {"token": TOKEN},
                    "timeouts": TEST_TIMEOUTS,
                }
                | self.settings_overrides
            )
        )
        self.service = AgentService(self.engine, settings)
        await self.service.start()
        app = build_admin_app(self.service, token=TOKEN)
        app.middlewares.insert(0, fault_middleware(self.faults, self._touch))
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True, backlog=self.backlog).start()
        self.port = self.runner.addresses[0][1]
        if self.serve_inference:
            inference = build_sim_inference_app(self.engine)
            inference.middlewares.insert(0, fault_middleware(self.inference_faults))
            self.inference_runner = web.AppRunner(inference, access_log=None, shutdown_timeout=0.5)
            await self.inference_runner.setup()
            await web.TCPSite(self.inference_runner, "127.0.0.1", self.inference_port, reuse_address=True).start()
            self.inference_port = self.inference_runner.addresses[0][1]
        return self

    def _touch(self, request: web.Request) -> None:
        call = f"{request.method} {request.path}"
        self.traced.append((call, request.headers.get("X-Request-ID"), request.headers.get("traceparent")))
        if request.method != "GET" and call not in CHANGES_NOTHING:
            self.touched.append(call)

    def touched_by(self, request_id: str) -> list[str]:
        """The mutating calls that carried `request_id` (the controller passes a request's id on to
        every worker call it makes for it): what that one request did here, whatever the
        reconciler or a status poll did meanwhile."""
        return [
            call
            for call, rid, _trace in self.traced
            if rid == request_id and not call.startswith("GET ") and call not in CHANGES_NOTHING
        ]

    async def stop(self) -> None:
        await self.runner.cleanup()
        if self.serve_inference:
            await self.inference_runner.cleanup()
        await self.engine.shutdown()

    async def restart(self) -> None:
        """A fresh process image: base weights, no adapters, unpaused, same address."""
        await self.stop()
        await self.start()


async def start_fleet(n: int, roots: list[Path], **engine_kwargs: Any) -> list[SimAgent]:
    return list(
        await asyncio.gather(*(SimAgent(f"w{i}", roots, engine_kwargs=dict(engine_kwargs)).start() for i in range(n)))
    )


def sim_agent_process(
    agent_id: str, workdir: Path, roots: list[Path], *, op_latency_s: float = 0.05, admin_port: int | None = None
) -> AgentProcess:
    """A SimEngine agent process configured as a controller-managed pod: not ready until told
    the desired version, JSON logs (so loads can be counted), short engine deadlines, a fixed
    admin port (a restarted agent comes back on the same address, as a pod behind a Service)."""
    config = {
        "agent_id": agent_id,
        "allowed_roots": [str(r) for r in roots],
        "log_format": "json",
        "require_desired_version": True,
        "admin": {"port": admin_port or free_port(), "token": TOKEN},
        "engine": {"kind": "sim", "model": "sim", "sim_op_latency_s": op_latency_s},
        "timeouts": TEST_TIMEOUTS,
    }
    return AgentProcess(config, workdir / agent_id, token=TOKEN, start_timeout_s=60)


# -- many agents per process ----------------------------------------------------------------------
async def serve(
    count: int, first: int, root: Path, latency_s: float, ready: Path, *, require_desired_version: bool = False
) -> None:
    """Serve `count` agents (ids w<first>..), write their ports to `ready`, stop on SIGTERM or
    when stdin closes (the parent went away)."""
    overrides = {
        "log_format": "json",
        "log_level": "error",
        "require_desired_version": require_desired_version,
        "timeouts": {"pause_s": 60, "control_s": 60, "weight_load_s": 60},
    }
    agents = []
    for i in range(first, first + count):  # one by one: a thousand at once would swamp the loop
        agents.append(
            await SimAgent(
                f"w{i:05d}",
                [root],
                engine_kwargs={"op_latency_s": latency_s},
                settings_overrides=overrides,
                backlog=1024,
            ).start()
        )
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"first": first, "ports": [a.port for a in agents]}))
    tmp.rename(ready)  # atomic: the parent never reads half a list
    settle()  # 512 agents' apps are ~280,000 objects: never walked again by the collector (rlcp/core/heap.py)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)  # EOF (parent gone) makes stdin readable
    await stop.wait()
    for agent in agents:
        await agent.stop()


@dataclass
class HostedAgent:
    id: str
    url: str

    def spec(self) -> dict[str, Any]:
        return {"id": self.id, "admin_url": self.url, "flavor": "agent"}


class HostedFleet:
    """`count` agents over `hosts` processes (`python -m rlcp.harness.simfleet`); a context manager
    that stops them all. `agents` interleaves the hosts, so the first N agents use them all."""

    def __init__(
        self,
        count: int,
        *,
        root: Path,
        latency_s: float,
        hosts: int = 2,
        require_desired_version: bool = False,
        start_timeout_s: float = 300.0,
        workdir: Path | None = None,
    ) -> None:
        self.count, self.root, self.latency_s = count, root, latency_s
        self.hosts = max(1, min(hosts, count))
        self.require_desired_version = require_desired_version
        self.start_timeout_s = start_timeout_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agents: list[HostedAgent] = []
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="sim-fleet-"))

    def __enter__(self) -> HostedFleet:
        per, extra = divmod(self.count, self.hosts)
        first, ready = 0, []
        for h in range(self.hosts):
            n = per + (1 if h < extra else 0)
            path, log = self.workdir / f"host-{h}.json", self.workdir / f"host-{h}.log"
            ready.append((path, log))
            with log.open("ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "rlcp.harness.simfleet",
                            "--count",
                            str(n),
                            "--first",
                            str(first),
                            "--root",
                            str(self.root),
                            "--latency-s",
                            str(self.latency_s),
                            "--ready",
                            str(path),
                        ]
                        + (["--require-desired-version"] if self.require_desired_version else []),
                        cwd=REPO,
                        stdin=subprocess.PIPE,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            first += n
        per_host: list[list[HostedAgent]] = []
        try:
            for (path, log), proc in zip(ready, self.procs):

                def up(path: Path = path, log: Path = log, proc: subprocess.Popen[bytes] = proc) -> bool:
                    if proc.poll() is not None:
                        raise RuntimeError(
                            f"agent host exited with {proc.returncode} while starting:\n"
                            + log.read_text(errors="replace")[-3000:]
                        )
                    return path.exists()

                wait_for_sync(up, self.start_timeout_s, "the agent hosts", interval_s=0.1)
                info = json.loads(path.read_text())
                per_host.append(
                    [
                        HostedAgent(f"w{info['first'] + i:05d}", f"http://127.0.0.1:{port}")
                        for i, port in enumerate(info["ports"])
                    ]
                )
        except BaseException:
            self.__exit__()
            raise
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


def main() -> None:
    p = argparse.ArgumentParser(description="Many real agents (SimEngine) in one process, one port each.")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--first", type=int, default=0, help="index of the first agent (its id is w<index>)")
    p.add_argument("--root", type=Path, required=True, help="allowed root of weight paths")
    p.add_argument("--latency-s", type=float, default=0.02, help="latency of each engine operation")
    p.add_argument("--ready", type=Path, required=True)
    p.add_argument(
        "--require-desired-version",
        action="store_true",
        help="agents stay not ready until a controller tells them the desired version",
    )
    a = p.parse_args()
    from rlcp.core.logs import configure_logging

    raise_fd_limit()
    configure_logging("json", "error")
    asyncio.run(
        serve(a.count, a.first, a.root, a.latency_s, a.ready, require_desired_version=a.require_desired_version)
    )


def raise_fd_limit() -> None:
    """A thousand agents and their connections need more descriptors than some defaults."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


if __name__ == "__main__":
    main()

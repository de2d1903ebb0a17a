"""`python -m bench.agent_host`: many real agents (SimEngine) in one process, one port each.

Fleet benchmarks need a thousand agents on a two-core machine. Each agent here is the
real agent code (`AgentService` + the admin app, as `tests/sim_fleet.SimAgent` builds
it, without its fault layer) on a SimEngine with a fixed latency per engine operation;
only the engine is simulated. The host writes its agents' ports, as JSON, to `--ready`
once all serve, and stops when its stdin closes (its parent went away) or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from aiohttp import web

from agents.admin.app import build_admin_app
from agents.engine.sim import SimEngine
from agents.service import AgentService
from agents.settings import AgentSettings
from bench.common import quiet_logs, raise_fd_limit

TOKEN = "bench-agent-token"


async def start_agent(agent_id: str, root: Path, latency_s: float, *,
                      require_desired_version: bool = False) -> tuple[web.AppRunner, int]:
    engine = SimEngine(model_name="sim", op_latency_s=latency_s)
    await engine.start()
    settings = AgentSettings(agent_id=agent_id, engine={"kind": "sim", "model": "sim"}, allowed_roots=[root],
                             admin={"token": TOKEN}, log_format="json", log_level="error",
                             require_desired_version=require_desired_version,
                             timeouts={"pause_s": 60, "control_s": 60, "weight_load_s": 60})
    service = AgentService(engine, settings)
    await service.start()
    runner = web.AppRunner(build_admin_app(service, token=TOKEN), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
    return runner, runner.addresses[0][1]


async def serve(count: int, first: int, root: Path, latency_s: float, ready: Path, *,
                require_desired_version: bool = False) -> None:
    runners: list[web.AppRunner] = []
    ports: list[int] = []
    for i in range(first, first + count):
        runner, port = await start_agent(f"w{i:05d}", root, latency_s,
                                         require_desired_version=require_desired_version)
        runners.append(runner)
        ports.append(port)
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"first": first, "ports": ports}))
    tmp.rename(ready)  # atomic: the parent never reads half a list
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)  # EOF (parent gone) makes stdin readable
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--first", type=int, default=0, help="index of the first agent (its id is w<index>)")
    p.add_argument("--root", type=Path, required=True, help="allowed root of weight paths")
    p.add_argument("--latency-s", type=float, default=0.02, help="latency of each engine operation")
    p.add_argument("--ready", type=Path, required=True)
    p.add_argument("--require-desired-version", action="store_true",
                   help="agents stay not ready until a controller tells them the desired version")
    a = p.parse_args()
    raise_fd_limit()
    quiet_logs()
    asyncio.run(serve(a.count, a.first, a.root, a.latency_s, a.ready,
                      require_desired_version=a.require_desired_version))


if __name__ == "__main__":
    main()

"""`python -m bench.gateway`: what the inference gateway adds over calling a worker directly.

Three processes: two upstream workers (a minimal aiohttp app answering `/v1/completions`
with a fixed OpenAI-shaped body, so the worker costs next to nothing and the gateway's
own cost shows), the standalone gateway (`python -m rlcp.controlplane.gateway`, the same code
as in the controller) following a fixed fleet state served by this process, and the load
generator here. The gateway is pinned to CPU 0, everything else to CPU 1, so "on one core"
is literal.

In one run, against the same workers:
- added latency: one request at a time, direct to a worker and through the gateway,
  p50 and p99 of each and their difference;
- throughput: `--concurrency` clients back to back for `--duration` seconds, direct and
  through the gateway; the gateway's CPU seconds over that window (from /proc) give
  requests per CPU-second of the gateway, i.e. what one core sustains, whatever the load
  generator (which shares a core with the workers) could push.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import plot, quiet_logs, report, table
from rlcp.core.wire.controller import AppliedState, DesiredState, FleetState, RequestCounts, WorkerView
from rlcp.harness.processes import REPO, cpu_seconds

BODY = json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "tiny",
                   "choices": [{"index": 0, "text": " hello world", "logprobs": None, "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}).encode()
REQUEST = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 2}).encode()


# -- the upstream workers (their own process) -----------------------------------------------------------
async def _complete(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=BODY, content_type="application/json")


async def serve_upstreams(n: int, port_file: Path) -> None:
    ports = []
    runners = []
    for _ in range(n):
        app = web.Application()
        app.router.add_post("/v1/completions", _complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    port_file.write_text(json.dumps(ports))
    await asyncio.Event().wait()


# -- the fleet state the gateway follows ----------------------------------------------------------------
def fleet_state(ports: list[int]) -> FleetState:
    workers = [WorkerView(id=f"bench-{i}", admin_url=f"http://127.0.0.1:1/{i}", inference_url=f"http://127.0.0.1:{p}",
                          flavor="agent", world_size=1, reachable=True, ready=True, serving=True, paused=False,
                          requests=None, weight_version="v1", loras={}, engine_alive=True)
               for i, p in enumerate(ports)]
    return FleetState(phase="serving", quiesced=False, pause_state="running",
                      requests=RequestCounts(running=0, waiting=0, frozen=0),
                      desired=DesiredState(weight_version="v1", applied_versions=["v1"]),
                      applied=AppliedState(weight_version="v1", converged=True, verified=True),
                      membership_epoch=1, discovery_synced=True, last_operation=None, workers=workers)


def _wait_file(path: Path, proc: subprocess.Popen, what: str, timeout_s: float = 30.0) -> Any:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if path.exists() and path.read_text().strip():
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not start within {timeout_s}s")


def _pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


# -- the load -------------------------------------------------------------------------------------------
async def sequential(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.post(url, data=REQUEST, headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        out.append(time.perf_counter() - t0)
    return out


async def saturate(session: aiohttp.ClientSession, url: str, concurrency: int, duration_s: float) -> int:
    done = 0
    end = time.perf_counter() + duration_s

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < end:
            async with session.post(url, data=REQUEST, headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            done += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    up_file, gw_file = workdir / "upstreams.json", workdir / "gateway.json"
    env = os.environ | {"PYTHONPATH": str(REPO)}
    upstream = subprocess.Popen([*_pinned(1), sys.executable, "-m", "bench.gateway", "--upstreams", "2",
                                 "--port-file", str(up_file)], cwd=REPO, env=env)
    gateway: subprocess.Popen | None = None
    state_runner: web.AppRunner | None = None
    try:
        ports = _wait_file(up_file, upstream, "upstream workers")
        body = fleet_state(ports).model_dump_json().encode()

        async def state(_: web.Request) -> web.Response:
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/rl/state", state)
        state_runner = web.AppRunner(app, access_log=None)
        await state_runner.setup()
        await web.TCPSite(state_runner, "127.0.0.1", 0).start()
        ctl_port = state_runner.addresses[0][1]
        config = workdir / "gateway.yaml"
        config.write_text(json.dumps({"log_level": "error", "gateway": {
            "host": "127.0.0.1", "port": 0, "follow_url": f"http://127.0.0.1:{ctl_port}", "follow_interval_s": 1.0}}))
        gateway = subprocess.Popen([*_pinned(0), sys.executable, "-m", "rlcp.controlplane.gateway", "--config", str(config),
                                    "--port-file", str(gw_file)], cwd=REPO, env=env)
        gw_port = _wait_file(gw_file, gateway, "gateway")["port"]
        direct = f"http://127.0.0.1:{ports[0]}/v1/completions"
        via = f"http://127.0.0.1:{gw_port}/v1/completions"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
            end = time.monotonic() + 30
            while time.monotonic() < end:  # until the gateway has read the state and admits the workers
                async with session.get(f"http://127.0.0.1:{gw_port}/readyz") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise TimeoutError("the gateway never became ready")
            await sequential(session, direct, 200)  # warm both paths
            await sequential(session, via, 200)
            lat: dict[str, list[float]] = {"direct": [], "gateway": []}
            for _ in range(args.repeats):  # interleaved, so drift on the shared machine hits both alike
                lat["direct"] += await sequential(session, direct, args.requests)
                lat["gateway"] += await sequential(session, via, args.requests)
            rates: dict[str, list[float]] = {"direct": [], "gateway": []}
            per_cpu: list[float] = []
            for _ in range(args.repeats):
                n = await saturate(session, direct, args.concurrency, args.duration_s)
                rates["direct"].append(n / args.duration_s)
                cpu0 = cpu_seconds(gateway.pid) or 0.0
                n = await saturate(session, via, args.concurrency, args.duration_s)
                cpu = (cpu_seconds(gateway.pid) or 0.0) - cpu0
                rates["gateway"].append(n / args.duration_s)
                per_cpu.append(n / cpu if cpu > 0 else float("nan"))
    finally:
        for proc in (gateway, upstream):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        if state_runner is not None:
            await state_runner.cleanup()
    paths = {k: {"p50_ms": _pct(v, 50) * 1e3, "p99_ms": _pct(v, 99) * 1e3, "rps": statistics.median(rates[k])}
             for k, v in lat.items()}
    return {**paths, "direct_rps": paths["direct"]["rps"], "gateway_rps": paths["gateway"]["rps"],
            "added_p50_ms": paths["gateway"]["p50_ms"] - paths["direct"]["p50_ms"],
            "added_p99_ms": paths["gateway"]["p99_ms"] - paths["direct"]["p99_ms"],
            "gateway_req_per_cpu_s": statistics.median(per_cpu),
            "concurrency": args.concurrency, "duration_s": args.duration_s, "repeats": args.repeats,
            "requests_per_latency_run": args.requests}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(prog="bench.gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500, help="sequential requests per path per repeat")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=5.0, help="seconds per throughput run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--upstreams", type=int, help=argparse.SUPPRESS)  # internal: serve the workers
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.upstreams:
        asyncio.run(serve_upstreams(args.upstreams, args.port_file))
        return None
    quiet_logs()
    affinity = os.sched_getaffinity(0)
    if _pinned(1):
        os.sched_setaffinity(0, {1})
    try:
        with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
    finally:
        os.sched_setaffinity(0, affinity)
    d, g = result["direct"], result["gateway"]
    text = table(["path", "p50 ms", "p99 ms", "req/s (load gen. bound)"], [
        ["direct to a worker", d["p50_ms"], d["p99_ms"], d["rps"]],
        ["through the gateway", g["p50_ms"], g["p99_ms"], g["rps"]],
        ["added by the gateway", result["added_p50_ms"], result["added_p99_ms"], None]])
    notes = [f"gateway: {result['gateway_req_per_cpu_s']:,.0f} proxied requests per CPU-second (one core); "
             f"throughput ratio gateway/direct {g['rps'] / d['rps']:.2f}"]
    return report("gateway", result, args.out, text=text, notes_after=notes, draw=lambda out: draw(result, out))


def draw(result: dict[str, Any], out: Path) -> Path:
    def bars(ax: Any) -> None:
        names = ["direct", "gateway"]
        ax.bar([0, 1], [result[n]["p50_ms"] for n in names], width=0.35, label="p50")
        ax.bar([0.35, 1.35], [result[n]["p99_ms"] for n in names], width=0.35, label="p99")
        ax.set_xticks([0.175, 1.175], ["direct to a worker", "through the gateway"])
        ax.set_ylabel("latency of one request, ms")
        ax.legend()

    return plot("gateway", bars, out)


if __name__ == "__main__":
    main()

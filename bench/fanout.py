"""`python -m bench.fanout`: the cost of one update cycle through the controller, per fleet size.

One cycle is what a trainer asks for once per step: tell the desired version, pause
(keep), update from disk, verify (version and weight checksums), resume. Hand-rolled, that is
six calls per worker; the controller makes four (a check that the checkpoint is loadable
there, before anyone pauses -- headers only, no engine call -- then prepare, a load answering
its version and checksums, a resume answering the status), the barriers in between. Every agent is
the real agent on a SimEngine whose every engine operation sleeps `--latency-s`, so a
cycle can never be faster than the engine operations on its critical path (the *floor*:
pause 1, disk update 3 -- load, name the version, drop the prefix cache -- checksums 1,
resume 1, i.e. 6 x latency). What is above the floor is the overhead measured here.

Side by side, in the same run and against the same agents:
- controller: `POST /v1/rl/update_weights` (verify on) on the real controller, run as it is
  deployed: the `python -m rlcp.controlplane` daemon (API front and core, in processes of their own;
  "ctl CPU" is what those processes used). In this process it would share a heap and a
  collector with the baselines, under CPython's default thresholds rather than the daemon's
  settled heap (`rlcp/core/heap.py`): at 1,024 workers that was ~340 collections per cycle, a
  third of the cycle's time inside the collector;
- httpx gather: what a trainer hand-rolls today -- per phase, an unbounded
  `asyncio.gather` over the workers, one `httpx.AsyncClient` per worker, the same calls;
- httpx sequential: the same calls one worker after another (only up to `--seq-max`
  workers; above that it is extrapolated linearly from the largest size measured);
- aiohttp gather: the same calls through a bare aiohttp session (no controller logic):
  what the HTTP stack alone costs;
- raw rate: requests/s a bare aiohttp session sustains against the same agents
  (`GET /healthz`, all agents at once, repeated).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.common import controller_daemon, median, plot, quiet_logs, report, table
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import wait_reachable
from rlcp.harness.procfs import controller_pids, cpu_seconds
from rlcp.harness.simfleet import TOKEN, HostedAgent, HostedFleet, raise_fd_limit

CTL_TOKEN = "bench-ctl-token"
AGENT_HEADERS = {"Authorization": f"Bearer {TOKEN}"}
ENGINE_OPS_PER_CYCLE = 6  # pause, load + set version + reset prefix cache, checksums, resume
CONTROLLER_CALLS_PER_WORKER = 4  # check, prepare, load (answering version and checksums), resume (answering state)
_versions = itertools.count(1)


def next_version(ckpts: list[Path]) -> tuple[str, Path]:
    n = next(_versions)
    return f"v{n}", ckpts[n % len(ckpts)]


# -- the controller ------------------------------------------------------------------------------
class ControllerUnderTest:
    """The controller as it is deployed: `python -m rlcp.controlplane` (its API front and its core),
    in processes of its own, so its heap, collector settings and CPU are its own and the
    hand-rolled baselines keep this process's (a trainer's) defaults."""

    def __init__(
        self, agents: list[HostedAgent], root: Path, max_concurrency: int, *, worker_token: str = TOKEN
    ) -> None:
        self.members = len(agents)
        self.process = controller_daemon(
            [a.spec() for a in agents],
            root,
            name=f"controller-{self.members}",
            api={"token": CTL_TOKEN},
            workers={
                "token": worker_token,
                "max_concurrency": max_concurrency,
                "timeout_s": 60,
                "pause_timeout_s": 300,
                "weight_load_timeout_s": 600,
            },
            # Polls and reconcile passes would run during the cycles measured: only the first one runs.
            reconcile={"poll_interval_s": 3600, "interval_s": 3600},
            log_level="error",
        )

    async def __aenter__(self) -> ControllerUnderTest:
        await self.process.spawn().wait_ready_async()
        self.url = self.process.url
        self.session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {CTL_TOKEN}"})
        try:  # the first status poll runs at start-up; later ones would run during the cycles
            await wait_reachable(self.session, self.url, workers=self.members, timeout_s=120)
        except BaseException:
            await self.__aexit__()
            raise
        self.pids = list(controller_pids(self.process.pid).values())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        self.process.stop()

    def cpu_seconds(self) -> float:
        """The CPU seconds its processes (front and core) have used so far."""
        return sum(cpu_seconds(pid) or 0.0 for pid in self.pids)

    async def cycle(self, ckpts: list[Path]) -> None:
        await self.cycle_at(*next_version(ckpts))

    async def cycle_at(self, version: str, path: Path) -> None:
        body = {"version": version, "source": {"kind": "disk", "path": str(path)}, "pause_mode": "keep", "verify": True}
        async with self.session.post(self.url + "/v1/rl/update_weights", json=body) as resp:
            answer = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"controller answered {resp.status}: {str(answer)[:400]}")


# -- the hand-rolled baselines ---------------------------------------------------------------------
Call = tuple[str, str, dict[str, Any]]  # method, path, request kwargs


def cycle_phases(version: str, path: Path) -> list[Call]:
    return [
        ("PUT", "/v1/agent/desired", {"json": {"weight_version": version}}),
        ("POST", "/pause", {"params": {"mode": "keep", "timeout_s": "60"}}),
        ("POST", "/v1/agent/weights/disk", {"json": {"path": str(path), "version": version}}),
        ("GET", "/v1/agent/state", {}),
        ("POST", "/weight_checker", {"json": {"action": "checksum"}}),
        ("POST", "/resume", {}),
    ]


def _check(url: str, status: int, body: Any, version: str, path_: str) -> None:
    if status != 200:
        raise RuntimeError(f"{url}{path_} answered {status}")
    if path_ == "/v1/agent/state" and body["weight_version"] != version:
        raise RuntimeError(f"{url} reports version {body['weight_version']!r}, expected {version!r}")


async def httpx_call(clients: dict[str, httpx.AsyncClient], agent: HostedAgent, version: str, call: Call) -> None:
    method, path, kw = call
    resp = await clients[agent.id].request(method, path, **kw)
    _check(agent.url, resp.status_code, resp.json(), version, path)


async def aiohttp_call(session: aiohttp.ClientSession, agent: HostedAgent, version: str, call: Call) -> None:
    method, path, kw = call
    async with session.request(method, agent.url + path, headers=AGENT_HEADERS, **kw) as resp:
        body = await resp.json()
    _check(agent.url, resp.status, body, version, path)


async def gather_cycle(
    agents: list[HostedAgent], ckpts: list[Path], call: Callable[[HostedAgent, str, Call], Awaitable[None]]
) -> None:
    version, path = next_version(ckpts)
    for phase in cycle_phases(version, path):
        await asyncio.gather(*(call(a, version, phase) for a in agents))


async def sequential_cycle(
    agents: list[HostedAgent], ckpts: list[Path], call: Callable[[HostedAgent, str, Call], Awaitable[None]]
) -> None:
    version, path = next_version(ckpts)
    for phase in cycle_phases(version, path):
        for a in agents:
            await call(a, version, phase)


async def raw_rate(agents: list[HostedAgent], rounds: int) -> float:
    """Requests/s of a bare aiohttp session: every agent at once, `rounds` times."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(a: HostedAgent) -> None:
            async with session.get(a.url + "/healthz") as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{a.url}/healthz answered {resp.status}")

        await asyncio.gather(*(one(a) for a in agents))  # connections opened before the clock starts
        t0 = time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(one(a) for a in agents))
        return rounds * len(agents) / (time.perf_counter() - t0)


async def timed_repeats(
    k: int,
    fn: Callable[[], Awaitable[None]],
    warmup: int = 1,
    cpu: list[float] | None = None,
    cpu_clock: Callable[[], float] = time.process_time,
) -> list[float]:
    """Wall seconds of each of `k` runs; with `cpu`, the CPU seconds `cpu_clock` counts in each too."""
    for _ in range(warmup):  # connections opened, first-call costs paid
        await fn()
    times = []
    for _ in range(k):
        c0, t0 = cpu_clock(), time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(cpu_clock() - c0)
    return times


# -- the run ------------------------------------------------------------------------------------------
async def measure(
    fleet: HostedFleet,
    sizes: list[int],
    ckpts: list[Path],
    *,
    repeats: int,
    seq_max: int,
    max_concurrency: int | None,
    raw_rounds: int,
) -> list[dict[str, Any]]:
    rows = []
    floor = ENGINE_OPS_PER_CYCLE * fleet.latency_s
    for n in sizes:
        agents = fleet.agents[:n]
        row: dict[str, Any] = {"n": n, "floor_s": floor}
        conc = max_concurrency or max(n, 64)
        async with ControllerUnderTest(agents, fleet.root, conc) as ctl:
            row["controller_max_concurrency"] = conc
            cpu: list[float] = []
            row["controller_s"] = await timed_repeats(
                repeats, lambda: ctl.cycle(ckpts), cpu=cpu, cpu_clock=ctl.cpu_seconds
            )
            row["controller_cpu_ms_per_worker"] = median(cpu) / n * 1e3
        # One client per worker, as trainers write it: a single shared httpx client is far
        # slower still with hundreds of connections (its pool scans every connection per request).
        clients = {a.id: httpx.AsyncClient(base_url=a.url, headers=AGENT_HEADERS, timeout=120) for a in agents}
        try:
            call = lambda a, v, c: httpx_call(clients, a, v, c)  # noqa: E731
            row["httpx_gather_s"] = await timed_repeats(repeats, lambda: gather_cycle(agents, ckpts, call))
            if n <= seq_max:
                row["httpx_sequential_s"] = await timed_repeats(
                    repeats, lambda: sequential_cycle(agents, ckpts, call), warmup=0
                )
        finally:
            await asyncio.gather(*(c.aclose() for c in clients.values()))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            call = lambda a, v, c: aiohttp_call(session, a, v, c)  # noqa: E731
            row["aiohttp_gather_s"] = await timed_repeats(repeats, lambda: gather_cycle(agents, ckpts, call))
        row["raw_rate_rps"] = [await raw_rate(agents, raw_rounds) for _ in range(repeats)]
        rows.append(summarize(row))
        print(
            f"  N={n}: controller {row['controller']['median_s']:.3f}s, httpx gather "
            f"{row['httpx_gather']['median_s']:.3f}s, floor {floor:.3f}s",
            flush=True,
        )
    extrapolate_sequential(rows)
    return rows


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    n, floor = row["n"], row["floor_s"]
    for key in ("controller", "httpx_gather", "aiohttp_gather", "httpx_sequential"):
        times = row.pop(f"{key}_s", None)
        if times is None:
            continue
        fl = floor * n if key == "httpx_sequential" else floor
        med = median(times)
        row[key] = {
            "times_s": [round(t, 5) for t in times],
            "median_s": med,
            "overhead_s": max(med - fl, 0.0),
            "floor_s": fl,
        }
    rates = row.pop("raw_rate_rps")
    row["raw_rate"] = {"rps": [round(r, 1) for r in rates], "median_rps": median(rates)}
    calls = CONTROLLER_CALLS_PER_WORKER * n
    # What the raw rate allows for the controller's calls: the best a fan-out over this stack can do.
    row["raw_floor_overhead_s"] = calls / row["raw_rate"]["median_rps"]
    ctl = row["controller"]["overhead_s"]
    row["ratio_ctl_vs_gather"] = ctl / row["httpx_gather"]["overhead_s"] if row["httpx_gather"]["overhead_s"] else None
    row["ratio_ctl_vs_raw"] = ctl / row["raw_floor_overhead_s"]
    row["controller_calls_per_s"] = calls / ctl if ctl else None
    return row


def extrapolate_sequential(rows: list[dict[str, Any]]) -> None:
    measured = [r for r in rows if "httpx_sequential" in r]
    if not measured:
        return
    base = measured[-1]
    per_worker = base["httpx_sequential"]["overhead_s"] / base["n"]
    for r in rows:
        if "httpx_sequential" not in r:
            fl = r["floor_s"] * r["n"]
            r["httpx_sequential"] = {
                "extrapolated_from_n": base["n"],
                "median_s": fl + per_worker * r["n"],
                "overhead_s": per_worker * r["n"],
                "floor_s": fl,
            }


def render(rows: list[dict[str, Any]]) -> str:
    headers = [
        "N",
        "floor ms",
        "controller ms",
        "ctl overhead ms",
        "httpx gather ms",
        "gather overhead ms",
        "ctl/gather overhead",
        "sequential ms",
        "aiohttp gather ms",
        "raw req/s",
        "ctl/raw-rate bound",
        "ctl CPU ms/worker",
    ]
    out = []
    for r in rows:
        seq = r.get("httpx_sequential")
        sequential = (
            "-" if seq is None else f"{seq['median_s'] * 1e3:,.0f}" + ("*" if "extrapolated_from_n" in seq else "")
        )
        out.append(
            [
                r["n"],
                r["floor_s"] * 1e3,
                r["controller"]["median_s"] * 1e3,
                r["controller"]["overhead_s"] * 1e3,
                r["httpx_gather"]["median_s"] * 1e3,
                r["httpx_gather"]["overhead_s"] * 1e3,
                r["ratio_ctl_vs_gather"],
                sequential,
                r["aiohttp_gather"]["median_s"] * 1e3,
                r["raw_rate"]["median_rps"],
                r["ratio_ctl_vs_raw"],
                r["controller_cpu_ms_per_worker"],
            ]
        )
    return table(headers, out)


def draw(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    def d(ax: Any) -> None:
        ns = [r["n"] for r in rows]
        ax.plot(ns, [r["controller"]["overhead_s"] * 1e3 for r in rows], "o-", label="controller")
        ax.plot(ns, [r["httpx_gather"]["overhead_s"] * 1e3 for r in rows], "s-", label="httpx gather (hand-rolled)")
        ax.plot(ns, [r["aiohttp_gather"]["overhead_s"] * 1e3 for r in rows], "^-", label="aiohttp gather (bare)")
        if all("httpx_sequential" in r for r in rows):  # none when every size is above --seq-max
            ax.plot(
                ns, [r["httpx_sequential"]["overhead_s"] * 1e3 for r in rows], "x--", label="sequential (* extrap.)"
            )
        ax.plot(
            ns, [r["raw_floor_overhead_s"] * 1e3 for r in rows], ":", color="grey", label="calls / raw aiohttp rate"
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("workers (N)")
        ax.set_ylabel("cycle time above the floor (ms)")
        ax.set_title("Update cycle overhead (median)")
        ax.legend(fontsize=7)

    return plot("fanout", d, out_dir)


async def amain(a: argparse.Namespace) -> dict[str, Any]:
    sizes = sorted(a.sizes)
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        root = Path(tmp)
        ckpts = [write_checkpoint(root / f"ckpt-{i}", i) for i in range(2)]
        print(f"bench.fanout: starting {sizes[-1]} agents in {a.hosts} host processes", flush=True)
        t0 = time.perf_counter()
        with HostedFleet(sizes[-1], root=root, latency_s=a.latency_s, hosts=a.hosts) as fleet:
            print(f"  agents up in {time.perf_counter() - t0:.1f}s", flush=True)
            rows = await measure(
                fleet,
                sizes,
                ckpts,
                repeats=a.repeats,
                seq_max=a.seq_max,
                max_concurrency=a.max_concurrency,
                raw_rounds=a.raw_rounds,
            )
    return {
        "params": {
            "sizes": sizes,
            "latency_s": a.latency_s,
            "repeats": a.repeats,
            "seq_max": a.seq_max,
            "hosts": a.hosts,
            "max_concurrency": a.max_concurrency,
            "raw_rounds": a.raw_rounds,
        },
        "rows": rows,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 128, 512, 1024])
    p.add_argument("--latency-s", type=float, default=0.02, help="each engine operation's latency")
    p.add_argument("--repeats", type=int, default=3, help="cycles per measurement; the median is reported")
    p.add_argument("--seq-max", type=int, default=128, help="largest N the sequential loop runs at")
    p.add_argument("--hosts", type=int, default=2, help="agent host processes")
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="controller workers.max_concurrency (default: max(N, 64), a fleet-sized setting)",
    )
    p.add_argument("--raw-rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    raise_fd_limit()
    quiet_logs()
    result = asyncio.run(amain(a))
    return report(
        "fanout",
        result,
        a.out,
        text=render(result["rows"]),
        draw=lambda out: draw(result["rows"], out),
        notes_after=["* extrapolated linearly from the largest N measured sequentially"]
        if any("extrapolated_from_n" in r.get("httpx_sequential", {}) for r in result["rows"])
        else [],
    )


if __name__ == "__main__":
    main()

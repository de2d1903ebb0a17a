"""`python -m bench.state_endpoint`: `GET /v1/rl/state` of a controller with 1024 members.

The real controller daemon (`python -m controlplane`, its own process, default status
poll every second) watches a fleet of real agents on SimEngine hosted in other
processes (`harness.simfleet`); an aiohttp load generator in this process reads the
state at a fixed concurrency for a fixed time. Reported: p50, p99 and requests/s, and
as the baseline in the same run, the same controller's `GET /healthz` at the same
concurrency (the HTTP stack's ceiling on this machine), so the ratio says what building
and serialising the state document costs. This is the static measurement; state under
load during update cycles is `bench/load_state.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import median, plot, quiet_logs, report, table
from harness.controller import wait_reachable
from harness.processes import ControllerProcess
from harness.simfleet import TOKEN, HostedAgent, HostedFleet, raise_fd_limit

CTL_TOKEN = "bench-ctl-token"


def controller(agents: list[HostedAgent], workdir: Path, poll_interval_s: float) -> ControllerProcess:
    """The controller daemon over `agents`; its tokens come from the environment, as in a pod."""
    config = {"controller_id": "bench", "api": {"host": "127.0.0.1", "port": 0}, "gateway": {"enabled": False},
              "discovery": {"kind": "static", "static": [a.spec() for a in agents]},
              "workers": {"max_concurrency": max(64, len(agents)), "timeout_s": 10},
              "reconcile": {"poll_interval_s": poll_interval_s, "interval_s": 1.0},
              "store": {"kind": "memory"}, "allowed_roots": [str(workdir)], "log_level": "warning"}
    return ControllerProcess(config, workdir, stop_timeout_s=20,
                             env={"RLCP_API__TOKEN": CTL_TOKEN, "RLCP_WORKERS__TOKEN": TOKEN})


async def load(session: aiohttp.ClientSession, url: str, concurrency: int, duration_s: float) -> dict[str, Any]:
    """`concurrency` clients, each reading `url` back to back for `duration_s`."""
    latencies: list[float] = []
    end = time.perf_counter() + duration_s

    async def client() -> None:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            async with session.get(url) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}")
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    return {"requests": len(latencies), "rps": len(latencies) / elapsed, "p50_s": pick(0.50), "p99_s": pick(0.99)}


async def measure(url: str, n: int, concurrencies: list[int], duration_s: float, repeats: int) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_reachable(session, url, workers=n, timeout_s=120)
        async with session.get(url + "/v1/rl/state") as resp:
            doc_bytes = len(await resp.read())
        await load(session, url + "/v1/rl/state", max(concurrencies), min(duration_s, 1.0))  # warm-up
        rows = []
        for c in concurrencies:
            runs: dict[str, list[dict[str, Any]]] = {"state": [], "healthz": []}
            for _ in range(repeats):  # interleaved, so drifting load on the machine hits both alike
                runs["state"].append(await load(session, url + "/v1/rl/state", c, duration_s))
                runs["healthz"].append(await load(session, url + "/healthz", c, duration_s))
            row: dict[str, Any] = {"concurrency": c}
            for key, rs in runs.items():
                row[key] = {"runs": rs, **{m: median([r[m] for r in rs]) for m in ("rps", "p50_s", "p99_s")}}
            row["rps_ratio_state_vs_healthz"] = row["state"]["rps"] / row["healthz"]["rps"]
            rows.append(row)
            print(f"  c={c}: state {row['state']['rps']:.0f} req/s p50 {row['state']['p50_s'] * 1e3:.1f} ms; "
                  f"healthz {row['healthz']['rps']:.0f} req/s", flush=True)
    return {"state_document_bytes": doc_bytes, "rows": rows}


def render(result: dict[str, Any]) -> str:
    out = []
    for r in result["rows"]:
        s, h = r["state"], r["healthz"]
        out.append([r["concurrency"], s["p50_s"] * 1e3, s["p99_s"] * 1e3, s["rps"], h["p50_s"] * 1e3, h["rps"],
                    r["rps_ratio_state_vs_healthz"]])
    return table(["concurrency", "state p50 ms", "state p99 ms", "state req/s", "healthz p50 ms", "healthz req/s",
                  "state/healthz req/s"], out)


def draw(result: dict[str, Any], out_dir: Path) -> Path:
    def d(ax: Any) -> None:
        cs = [str(r["concurrency"]) for r in result["rows"]]
        x = range(len(cs))
        ax.bar([i - 0.2 for i in x], [r["state"]["p50_s"] * 1e3 for r in result["rows"]], 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [r["state"]["p99_s"] * 1e3 for r in result["rows"]], 0.4, label="p99")
        ax.set_xticks(list(x), cs)
        ax.set_xlabel("concurrent readers")
        ax.set_ylabel("latency (ms)")
        rates = ", ".join(f"{r['state']['rps']:.0f}" for r in result["rows"])
        ax.set_title(f"GET /v1/rl/state, {result['params']['workers']} workers ({rates} req/s)", fontsize=9)
        ax.legend(fontsize=8)

    return plot("state_endpoint", d, out_dir)


async def amain(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        workdir = Path(tmp)
        print(f"bench.state_endpoint: starting {a.workers} agents in {a.hosts} host processes", flush=True)
        with HostedFleet(a.workers, root=workdir, latency_s=0.0, hosts=a.hosts) as fleet:
            ctl = controller(fleet.agents, workdir, a.poll_interval_s)
            try:
                await ctl.spawn().wait_ready_async()
                result = await measure(ctl.url, a.workers, a.concurrency, a.duration_s, a.repeats)
            finally:
                ctl.stop()
    result["params"] = {"workers": a.workers, "concurrency": a.concurrency, "duration_s": a.duration_s,
                        "repeats": a.repeats, "poll_interval_s": a.poll_interval_s, "hosts": a.hosts}
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1024)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    p.add_argument("--duration-s", type=float, default=5.0, help="length of one load run")
    p.add_argument("--repeats", type=int, default=3, help="load runs per measurement; the median is reported")
    p.add_argument("--poll-interval-s", type=float, default=1.0, help="the controller's status poll interval")
    p.add_argument("--hosts", type=int, default=2, help="agent host processes")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    raise_fd_limit()
    quiet_logs()
    result = asyncio.run(amain(a))
    return report("state_endpoint", result, a.out, text=render(result), draw=lambda out: draw(result, out),
                  notes_before=[f"state document: {result['state_document_bytes']:,} bytes"])


if __name__ == "__main__":
    main()

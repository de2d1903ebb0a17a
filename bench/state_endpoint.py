"""`python -m bench.state_endpoint`: `GET /v1/rl/state` of a controller with 1024 members.

The real controller daemon (`python -m rlcp.controlplane`, its own process, default status
poll every second) watches a fleet of real agents on SimEngine hosted in other
processes (`rlcp.harness.simfleet`); an aiohttp load generator in this process reads the
state at a fixed concurrency for a fixed time, each answer timed to its last byte. Three kinds
of reader (`--readers`): `plain` takes the whole JSON each time, `gzip` asks for it compressed
(aiohttp's default), `etag` also names the tag of the document it holds and gets 304 while
nothing changed. Each is measured against a controller with its API front (`--front on`,
the default daemon) and without (`off`, one process), on the same fleet in the same run.
Reported: p50, p99 and requests/s of each, and as the baselines in the same run, the `plain`
reader and the same controller's `GET /healthz` at the same concurrency (the HTTP stack's
ceiling on this machine), so the ratios say what each way of reading saves and what
building and sending the state document still costs. This is the static measurement; state under
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

from bench.common import controller_daemon, median, plot, quiet_logs, report, table
from rlcp.core.heap import collector_paused
from rlcp.harness.controller import wait_reachable
from rlcp.harness.simfleet import TOKEN, HostedFleet, raise_fd_limit

CTL_TOKEN = "bench-ctl-token"


# The readers: what a reader sends decides what the controller sends back.
READERS: dict[str, dict[str, str]] = {
    "plain": {"Accept-Encoding": "identity"},  # the whole JSON every time (what every reader got before gzip)
    "gzip": {},  # aiohttp's defaults: `Accept-Encoding: gzip, deflate`, decompressed on arrival
    "etag": {},  # gzip, and `If-None-Match` with the tag of the document this reader holds (dashboards,
    # `rlctl state --watch`, the standalone gateway's follower)
}


async def load(
    session: aiohttp.ClientSession, url: str, concurrency: int, duration_s: float, reader: str = "gzip"
) -> dict[str, Any]:
    """`concurrency` clients, each reading `url` back to back for `duration_s`, as `reader`
    does; every body is read whole (and decompressed when it came compressed)."""
    latencies: list[float] = []
    not_modified = 0
    end = time.perf_counter() + duration_s

    async def client() -> None:
        nonlocal not_modified
        headers = dict(READERS[reader])
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            async with session.get(url, headers=headers) as resp:
                await resp.read()
                if resp.status == 304:
                    not_modified += 1
                elif resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}")
                elif reader == "etag" and "ETag" in resp.headers:
                    headers["If-None-Match"] = resp.headers["ETag"]
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    latencies.sort()

    def pick(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_s": pick(0.50),
        "p99_s": pick(0.99),
        "not_modified": not_modified,
    }


async def sizes(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    """The document's size as sent plain and as sent gzip-compressed (on the wire)."""
    async with aiohttp.ClientSession(auto_decompress=False) as raw:
        async with raw.get(url, headers={"Accept-Encoding": "identity"}) as resp:
            plain = len(await resp.read())
        async with raw.get(url, headers={"Accept-Encoding": "gzip"}) as resp:
            zipped = len(await resp.read())
            encoding = resp.headers.get("Content-Encoding")
    return {"plain": plain, "gzip": zipped if encoding == "gzip" else plain}


async def measure(
    url: str, n: int, concurrencies: list[int], duration_s: float, repeats: int, readers: list[str]
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    # Timed to the last byte as sent: a reader's decompression is its own cost, and here it
    # would delay the other clients. This process's collector is kept out (rlcp/core/heap.py).
    with collector_paused():
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            await wait_reachable(session, url, workers=n, timeout_s=120, headers={"Accept-Encoding": "identity"})
            doc = await sizes(session, url + "/v1/rl/state")
            await load(session, url + "/v1/rl/state", max(concurrencies), min(duration_s, 1.0))  # warm-up
            rows = []
            for c in concurrencies:
                runs: dict[str, list[dict[str, Any]]] = {r: [] for r in (*readers, "healthz")}
                for _ in range(repeats):  # interleaved, so drifting load on the machine hits all alike
                    for reader in readers:
                        runs[reader].append(await load(session, url + "/v1/rl/state", c, duration_s, reader))
                    runs["healthz"].append(await load(session, url + "/healthz", c, duration_s))
                row: dict[str, Any] = {"concurrency": c}
                for key, rs in runs.items():
                    row[key] = {
                        "runs": rs,
                        **{m: median([r[m] for r in rs]) for m in ("rps", "p50_s", "p99_s")},
                        "not_modified_share": sum(r["not_modified"] for r in rs)
                        / max(1, sum(r["requests"] for r in rs)),
                    }
                row["state"] = row["gzip" if "gzip" in row else readers[0]]  # what an aiohttp reader gets
                for key in readers:
                    row[key]["rps_vs_healthz"] = row[key]["rps"] / row["healthz"]["rps"]
                    if "plain" in row:
                        row[key]["rps_vs_plain"] = row[key]["rps"] / row["plain"]["rps"]
                rows.append(row)
                print(
                    f"  c={c}: "
                    + "; ".join(
                        f"{k} {row[k]['rps']:.0f} req/s p50 {row[k]['p50_s'] * 1e3:.1f} ms "
                        f"p99 {row[k]['p99_s'] * 1e3:.1f} ms"
                        for k in (*readers, "healthz")
                    ),
                    flush=True,
                )
        return {
            "state_document_bytes": doc["plain"],
            "state_document_gzip_bytes": doc["gzip"],
            "readers": readers,
            "rows": rows,
        }


def render(result: dict[str, Any]) -> str:
    out = []
    for r in result["rows"]:
        h = r["healthz"]
        for reader in result["readers"]:
            s = r[reader]
            out.append(
                [
                    r.get("front", "on"),
                    r["concurrency"],
                    reader,
                    s["p50_s"] * 1e3,
                    s["p99_s"] * 1e3,
                    s["rps"],
                    s.get("rps_vs_plain"),
                    s["rps_vs_healthz"],
                    s["not_modified_share"],
                    h["p50_s"] * 1e3,
                    h["rps"],
                ]
            )
    return table(
        [
            "api.front",
            "concurrency",
            "reader",
            "state p50 ms",
            "state p99 ms",
            "state req/s",
            "req/s vs plain",
            "req/s vs healthz",
            "304 share",
            "healthz p50 ms",
            "healthz req/s",
        ],
        out,
    )


def draw(result: dict[str, Any], out_dir: Path) -> Path:
    def d(ax: Any) -> None:
        readers = result["readers"]
        labels = [f"{r.get('front', 'on')} c={r['concurrency']}\n{k}" for r in result["rows"] for k in readers]
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], [r[k]["p50_s"] * 1e3 for r in result["rows"] for k in readers], 0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [r[k]["p99_s"] * 1e3 for r in result["rows"] for k in readers], 0.4, label="p99")
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.set_title(
            f"GET /v1/rl/state, {result['params']['workers']} workers "
            f"({result['state_document_bytes'] / 1024:.0f} KiB, gzip "
            f"{result['state_document_gzip_bytes'] / 1024:.0f} KiB)",
            fontsize=9,
        )
        ax.legend(fontsize=8)

    return plot("state_endpoint", d, out_dir)


async def amain(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        workdir = Path(tmp)
        print(f"bench.state_endpoint: starting {a.workers} agents in {a.hosts} host processes", flush=True)
        with HostedFleet(a.workers, root=workdir, latency_s=0.0, hosts=a.hosts) as fleet:
            result: dict[str, Any] = {}
            for front in a.front:  # the same fleet, a controller each way of serving, in turn
                # Its tokens come from the environment, as in a pod.
                ctl = controller_daemon(
                    [agent.spec() for agent in fleet.agents],
                    workdir,
                    name=f"ctl-{front}",
                    env={"RLCP_API__TOKEN": CTL_TOKEN, "RLCP_WORKERS__TOKEN": TOKEN},
                    api={"front": front == "on"},
                    workers={"max_concurrency": max(64, a.workers)},
                    reconcile={"poll_interval_s": a.poll_interval_s},
                )
                try:
                    await ctl.spawn().wait_ready_async()
                    print(f"  api.front {front}:", flush=True)
                    measured = await measure(ctl.url, a.workers, a.concurrency, a.duration_s, a.repeats, a.readers)
                finally:
                    ctl.stop()
                for row in measured["rows"]:
                    row["front"] = front
                result = measured | {"rows": result.get("rows", []) + measured["rows"]}
    result["params"] = {
        "workers": a.workers,
        "concurrency": a.concurrency,
        "duration_s": a.duration_s,
        "repeats": a.repeats,
        "readers": a.readers,
        "poll_interval_s": a.poll_interval_s,
        "hosts": a.hosts,
        "front": a.front,
    }
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1024)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    p.add_argument("--duration-s", type=float, default=5.0, help="length of one load run")
    p.add_argument("--repeats", type=int, default=3, help="load runs per measurement; the median is reported")
    p.add_argument(
        "--readers",
        type=lambda s: [r for r in s.split(",") if r],
        default=list(READERS),
        help=f"reader kinds, comma-separated, from {', '.join(READERS)}",
    )
    p.add_argument("--poll-interval-s", type=float, default=1.0, help="the controller's status poll interval")
    p.add_argument("--hosts", type=int, default=2, help="agent host processes")
    p.add_argument(
        "--front",
        type=lambda s: [m for m in s.split(",") if m],
        default=["on", "off"],
        help="the controller's api.front, each in turn: on (reads answered by the front process) "
        "and off (one process, the baseline)",
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    raise_fd_limit()
    quiet_logs()
    result = asyncio.run(amain(a))
    return report(
        "state_endpoint",
        result,
        a.out,
        text=render(result),
        draw=lambda out: draw(result, out),
        notes_before=[
            f"state document: {result['state_document_bytes']:,} bytes, "
            f"{result['state_document_gzip_bytes']:,} bytes gzip-compressed"
        ],
    )


if __name__ == "__main__":
    main()

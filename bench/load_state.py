"""`python bench/load_state.py`: `GET /v1/rl/state` under load while update cycles run.

Three kinds of process on loopback, as in production: a fleet of real agents on SimEngine
(`rlcp.harness.simfleet`: one process serving many agents, one port each), the controller daemon
(`python -m rlcp.controlplane`: its API front and the core behind it, the core's status poller
reading every member each second), and this process, which runs the update cycles (the
trainer: one `POST /v1/rl/update_weights` after the other, each a full pause -> load ->
verify -> resume over the whole fleet) and the load generator (an aiohttp client, one
connection pool, `--concurrency` loops paced to `--rate` requests/s in total; a loop that
falls behind sends at once, so the achieved rate shows what the machine sustains). Each
answer is timed to its last byte as sent (a reader's own decompression is its cost, not the
answer's), and this process keeps its garbage collector out of the measurement.

`--readers` says how the loops read, in turn when several are named: `plain` takes the whole
JSON each time, `gzip` asks for it compressed (aiohttp's default), `etag` also names the tag
of the document it holds (`If-None-Match`) and gets 304 while nothing changed, as a
dashboard, `rlctl state --watch` or a gateway follower would; `healthz` reads `/healthz` at
the same pace, the HTTP stack's floor in the same run. `--front on,off` runs each reader
against the daemon with its API front (the default) and without it (one process, as before),
in turn on the same fleet. Ratios are against the first reader measured.

Reported (printed, and written as JSON to `--out`): requests, errors, achieved requests/s,
latency p50/p90/p99/max, the controller core's event-loop lag over each reader's run (from
its `rlcp_event_loop_lag_seconds`), update cycles run (and any that failed), the CPU seconds
each process used, and the machine. Every loop is bounded in count and time; loopback only.

    python bench/load_state.py                               # 256 workers, 120 s at 1000 req/s
    python bench/load_state.py --duration-s 30 --rate 0      # closed loop: as fast as it goes
    python bench/load_state.py --workers 1024 --hosts 2 --readers etag,healthz --front on,off --rounds 2

`tests/controlplane/api/test_load_state.py` runs the same code for 30 s and asserts that nothing failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(REPO))

CTL_TOKEN = "load-ctl-token"
DEFAULT_OUT = REPO / "bench" / "out" / "load_state.json"

from bench.common import controller_daemon  # noqa: E402
from rlcp.core.heap import collector_paused  # noqa: E402
from rlcp.harness.checkpoints import write_checkpoint  # noqa: E402  (after the sys.path line)
from rlcp.harness.controller import wait_reachable  # noqa: E402
from rlcp.harness.procfs import controller_pids, cpu_seconds  # noqa: E402
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN  # noqa: E402
from rlcp.harness.simfleet import HostedFleet, raise_fd_limit  # noqa: E402


# -- load and cycles ------------------------------------------------------------------------------------
@dataclass
class LoadStats:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    behind: int = 0  # sends more than 50 ms behind their loop's schedule
    body_bytes: int = 0
    wire_bytes: int = 0  # bodies as sent (compressed, when they were)
    not_modified: int = 0  # 304s (the `etag` reader)
    checked: int = 0  # bodies parsed and checked
    error_count: int = 0

    def error(self, what: str) -> None:
        self.error_count += 1
        if len(self.errors) < 20:
            self.errors.append(what)
        else:
            self.errors[-1] = f"... and more; last: {what}"


# What a reader sends decides what the controller sends back.
READERS: dict[str, dict[str, str]] = {
    "plain": {"Accept-Encoding": "identity"},  # the whole JSON every time (what every reader got before gzip)
    "gzip": {},  # aiohttp's defaults: `Accept-Encoding: gzip, deflate`, decompressed on arrival
    "etag": {},  # gzip, and `If-None-Match` with the tag of the document this loop holds: 304 while unchanged
    "healthz": {},  # `GET /healthz` at the same pace: the HTTP stack's floor on this machine, in the same run
}
LAG_METRIC = "rlcp_event_loop_lag_seconds"


async def loop_lag(session: Any, url: str) -> dict[float, float]:
    """The controller's event-loop lag histogram (`rlcp/controlplane/loopwatch.py`), cumulative
    counts by upper bound, from its /metrics."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(LAG_METRIC + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def lag_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Between two scrapes: probes, the bucket bound under which 50/99% of them woke, and
    how many woke later than 20 and 100 ms."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)

    def bound(q: float) -> float | None:
        return next((le for le, n in delta.items() if total and n >= q * total), None)

    def over(limit: float) -> float:
        return total - max((n for le, n in delta.items() if le <= limit), default=0.0)

    return {
        "probes": int(total),
        "p50_le_ms": _ms(bound(0.5)),
        "p99_le_ms": _ms(bound(0.99)),
        "over_20ms": int(over(0.02)),
        "over_100ms": int(over(0.1)),
    }


def _ms(value: float | None) -> float | str | None:
    return None if value is None else ("inf" if value == float("inf") else round(value * 1e3, 1))


async def generate_load(
    url: str, *, rate: float, concurrency: int, duration_s: float, workers: int, stats: LoadStats, reader: str = "gzip"
) -> float:
    """`concurrency` loops sharing one pool, paced to `rate` requests/s in total (0: no pacing),
    each reading as `reader` does (every body is read whole, and decompressed if it came so).
    Every 50th body is parsed and checked (a state of every member); returns the time taken."""
    import aiohttp

    ticket = itertools.count()
    start = stop_at = 0.0  # set once the loops can run (below)

    async def loop(session: aiohttp.ClientSession) -> None:
        headers = dict(READERS[reader])
        while True:
            n = next(ticket)
            if rate > 0:
                due = start + n / rate
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                elif now - due > 0.05:
                    stats.behind += 1
            if time.monotonic() >= stop_at:
                return
            t0 = time.perf_counter()
            try:
                async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    body = await resp.read()
                    status, encoding = resp.status, resp.headers.get("Content-Encoding")
                    if reader == "etag" and status == 200 and "ETag" in resp.headers:
                        headers["If-None-Match"] = resp.headers["ETag"]
            except (aiohttp.ClientError, TimeoutError) as exc:
                stats.error(f"{type(exc).__name__}: {exc}")
                continue
            stats.latencies.append(time.perf_counter() - t0)  # to the last byte, as sent
            stats.wire_bytes += len(body)
            if status == 304 and reader == "etag":
                stats.not_modified += 1
            elif status != 200:
                stats.error(f"HTTP {status}: {body[:200]!r}")
            elif n % 50 == 0 and reader != "healthz":
                if encoding == "gzip":
                    body = gzip.decompress(body)
                doc = json.loads(body)
                stats.checked += 1
                stats.body_bytes += len(body)
                if len(doc["workers"]) != workers or "phase" not in doc:
                    stats.error(f"a state with {len(doc['workers'])} workers, phase {doc.get('phase')!r}")

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    # Bodies are timed to their last byte as sent and decompressed only when checked: a
    # reader's own decompression (~1 ms per 500 KB document) is its cost, not the answer's,
    # and in this process it would delay the other loops' timings.
    with collector_paused():
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            # The window opens after the collector settled: that full collection took seconds in a
            # long-lived test process on a loaded machine, and a window opened before it was over
            # by the time the loops first ran (no request at all: the fast lane beside CI34).
            start = time.monotonic()
            stop_at = start + duration_s
            await asyncio.gather(*(loop(session) for _ in range(concurrency)))
    return time.monotonic() - start


async def run_cycles(url: str, ckpts: list[Path], stop: asyncio.Event, results: list[dict[str, Any]]) -> None:
    """Update cycles back to back until `stop` (the one running then finishes)."""
    import aiohttp

    headers = {"Authorization": f"Bearer {CTL_TOKEN}"}
    async with aiohttp.ClientSession() as session:
        for k in itertools.count(1):
            if stop.is_set():
                return
            body = {
                "version": f"load-{k}",
                "source": {"kind": "disk", "path": str(ckpts[k % len(ckpts)])},
                "pause_mode": "keep",
            }
            t0 = time.monotonic()
            try:
                async with session.post(
                    url + "/v1/rl/update_weights", json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=300)
                ) as resp:
                    doc = await resp.json()
                    results.append(
                        {
                            "version": body["version"],
                            "http": resp.status,
                            "status": doc.get("status"),
                            "duration_s": round(time.monotonic() - t0, 3),
                            "failed": [
                                r["worker_id"] for r in doc.get("results", []) if r["status"] not in ("ok", "skipped")
                            ][:10],
                        }
                    )
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                results.append(
                    {
                        "version": body["version"],
                        "http": None,
                        "status": f"{type(exc).__name__}: {exc}",
                        "duration_s": round(time.monotonic() - t0, 3),
                        "failed": [],
                    }
                )


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet; for each round and each way of serving (`--front`) in turn, start a
    controller, run cycles and load together, stop it; stop the fleet."""
    import aiohttp

    raise_fd_limit()
    fronts = args.front

    def keyed(front: int, reader: str) -> str:
        return f"front {front}: {reader}" if len(fronts) > 1 else reader

    keys = [keyed(front, reader) for front in fronts for reader in args.readers]
    stats = {key: LoadStats() for key in keys}
    took = dict.fromkeys(keys, 0.0)
    lags: dict[str, list[dict[str, Any]]] = {key: [] for key in keys}
    cycles: list[dict[str, Any]] = []
    cpu: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="load-state-") as tmp:
        workdir = Path(tmp)
        ckpts = [write_checkpoint(workdir / f"ckpt-{seed}", seed) for seed in (1, 2, 3)]
        fleet = HostedFleet(
            args.workers,
            root=workdir,
            latency_s=args.latency_s,
            hosts=args.hosts,
            require_desired_version=True,
            start_timeout_s=120,
            workdir=workdir,
        )
        t0 = time.monotonic()
        await asyncio.to_thread(fleet.__enter__)
        try:
            setup_s = time.monotonic() - t0
            for k in range(args.rounds):  # in turn, so drifting load on the machine hits each alike
                for front in fronts:
                    ctl = controller_daemon(
                        [a.spec() for a in fleet.agents],
                        workdir,
                        name=f"controller-{k}-front-{front}",
                        api={"token": CTL_TOKEN, "front": front == "on"},
                        workers={"token": AGENT_TOKEN},
                        reconcile={"poll_interval_s": args.poll_interval_s},
                        store={"kind": "file", "path": str(workdir / "store" / "desired.json")},
                    )
                    try:
                        await ctl.spawn().wait_ready_async()
                        url = ctl.url
                        async with aiohttp.ClientSession() as session:
                            await wait_reachable(session, url, workers=args.workers, timeout_s=120)
                        pids = {f"host-{i}": p.pid for i, p in enumerate(fleet.procs)} | controller_pids(ctl.pid)
                        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                        self_before = time.process_time()
                        stop = asyncio.Event()
                        cycler = asyncio.create_task(run_cycles(url, ckpts, stop, cycles), name="update-cycles")
                        async with aiohttp.ClientSession() as probe:
                            for reader in args.readers:
                                key = keyed(front, reader)
                                lag_before = await loop_lag(probe, url)
                                took[key] += await generate_load(
                                    url + ("/healthz" if reader == "healthz" else "/v1/rl/state"),
                                    rate=args.rate,
                                    concurrency=args.concurrency,
                                    duration_s=args.duration_s,
                                    workers=args.workers,
                                    stats=stats[key],
                                    reader=reader,
                                )
                                lags[key].append(lag_summary(lag_before, await loop_lag(probe, url)))
                        for name, pid in pids.items():
                            used = (cpu_seconds(pid) or 0) - (cpu_before[name] or 0)
                            label = (
                                f"{name} (front {front})" if len(fronts) > 1 and name.startswith("controller") else name
                            )
                            cpu[label] = round(cpu.get(label, 0.0) + used, 2)
                        cpu["load_generator_and_cycles"] = round(
                            cpu.get("load_generator_and_cycles", 0.0) + time.process_time() - self_before, 2
                        )
                        stop.set()
                        await asyncio.wait_for(cycler, 300)
                    finally:
                        ctl.stop()
        finally:
            fleet.__exit__()
        ok_cycles = [c for c in cycles if c["http"] == 200 and c["status"] == "ok"]
        cycle_times = sorted(c["duration_s"] for c in ok_cycles)
        by_reader = {key: _summary(stats[key], took[key]) | {"loop_lag": lags[key]} for key in keys}
        first = by_reader[keys[0]]
        for summary in by_reader.values():  # against the first reader, measured in the same run
            summary["rps_vs_first"] = round(summary["rps"] / first["rps"], 3) if first["rps"] else None
            summary["p99_vs_first"] = round(summary["latency_ms"]["p99"] / first["latency_ms"]["p99"], 3)
        return {
            "workers": args.workers,
            "hosts": args.hosts,
            "duration_s": round(sum(took.values()), 2),
            "target_rate": args.rate,
            "concurrency": args.concurrency,
            "poll_interval_s": args.poll_interval_s,
            "engine_op_latency_s": args.latency_s,
            "setup_s": round(setup_s, 1),
            "front": fronts,
            "readers": by_reader,
            # Over every reader: what the load test asserts on.
            "requests": sum(s["requests"] for s in by_reader.values()),
            "errors": sum(st.error_count for st in stats.values()),
            "error_samples": [e for st in stats.values() for e in st.errors][:20],
            "bodies_checked": sum(st.checked for st in stats.values()),
            # The first reader's figures, as before `--readers` existed.
            **{k: first[k] for k in ("rps", "latency_ms", "late_sends", "mean_body_kib")},
            "cycles": {
                "run": len(cycles),
                "ok": len(ok_cycles),
                "failed": [c for c in cycles if c not in ok_cycles],
                "p50_s": _percentile(cycle_times, 0.5) if cycle_times else None,
            },
            "cpu_s": cpu,
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
            },
        }


def _summary(stats: LoadStats, took: float) -> dict[str, Any]:
    lat = sorted(stats.latencies)
    n = max(1, len(lat))
    return {
        "requests": len(lat),
        "errors": stats.error_count,
        "rps": round(len(lat) / took, 1) if took else 0.0,
        "latency_ms": {
            name: round(_percentile(lat, q) * 1e3, 2)
            for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))
        },
        "late_sends": stats.behind,
        "bodies_checked": stats.checked,
        "mean_body_kib": round(stats.body_bytes / max(1, stats.checked) / 1024, 1),
        "mean_wire_kib": round(stats.wire_bytes / n / 1024, 1),
        "not_modified_share": round(stats.not_modified / n, 3),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="load_state.py", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=256, help="SimEngine agents in the fleet")
    p.add_argument("--hosts", type=int, default=1, help="processes the agents are spread over")
    p.add_argument("--duration-s", type=float, default=120.0, help="how long the load runs, in seconds")
    p.add_argument("--rate", type=float, default=1000.0, help="target requests/s in total; 0 = no pacing")
    p.add_argument("--concurrency", type=int, default=64, help="load loops (and pooled connections)")
    p.add_argument("--latency-s", type=float, default=0.01, help="latency of each simulated engine operation")
    p.add_argument("--poll-interval-s", type=float, default=1.0, help="the controller's status poll interval")
    p.add_argument(
        "--readers",
        type=lambda v: [r for r in v.split(",") if r],
        default=["gzip"],
        help=f"reader kinds in turn, comma-separated, from {', '.join(READERS)}; ratios are against the "
        "first (plain: the whole JSON each time; gzip: aiohttp's default; etag: also If-None-Match)",
    )
    p.add_argument("--rounds", type=int, default=1, help="times each reader runs (for --duration-s each), in turn")
    p.add_argument(
        "--front",
        type=lambda v: [m for m in v.split(",") if m],
        default=["on"],
        help="the controller's api.front, in turn when several are named: on (the default: reads "
        "answered by the front process) or off (one process, as before); ratios against the first",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON report")
    return p.parse_args(argv)


def report(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(
        f"GET /v1/rl/state, {result['workers']} workers, {result['concurrency']} loops, {result['duration_s']:g} s, "
        f"{result['cycles']['run']} update cycles ({result['cycles']['ok']} ok, p50 {result['cycles']['p50_s']} s)"
    )
    for reader, r in result["readers"].items():
        lat = r["latency_ms"]
        print(
            f"  {reader:>5}: {r['requests']} requests, {r['errors']} errors, {r['rps']:g} req/s "
            f"(target {result['target_rate']:g}), p50 {lat['p50']} ms, p90 {lat['p90']} ms, p99 {lat['p99']} ms, "
            f"max {lat['max']} ms, body {r['mean_body_kib']} KiB ({r['mean_wire_kib']} KiB sent), "
            f"304s {r['not_modified_share']:.0%}; vs {next(iter(result['readers']))}: req/s x{r['rps_vs_first']}, "
            f"p99 x{r['p99_vs_first']}"
        )
        for lag in r["loop_lag"]:
            print(
                f"         controller loop lag: {lag['probes']} probes, p50 <= {lag['p50_le_ms']} ms, "
                f"p99 <= {lag['p99_le_ms']} ms, {lag['over_20ms']} over 20 ms, {lag['over_100ms']} over 100 ms"
            )
    print(f"  CPU seconds: {result['cpu_s']}   (written to {out})")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = asyncio.run(measure(args))
    report(result, args.out)
    return result


if __name__ == "__main__":
    main()

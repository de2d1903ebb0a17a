"""`python bench/load_state.py`: `GET /v1/rl/state` under load while update cycles run.

Three kinds of process on loopback, as in production: a fleet of real agents on SimEngine
(`bench/agent_host.py`: one process serving many agents, one port each), the controller daemon
(`python -m controlplane`, its status poller reading every member each second), and this
process, which runs the update cycles (the trainer: one `POST /v1/rl/update_weights` after
the other, each a full pause -> load -> verify -> resume over the whole fleet) and the load
generator (an aiohttp client, one connection pool, `--concurrency` loops paced to `--rate`
requests/s in total; a loop that falls behind sends at once, so the achieved rate shows what
the machine sustains).

Reported (printed, and written as JSON to `--out`): requests, errors, achieved requests/s,
latency p50/p90/p99/max, update cycles run (and any that failed), the CPU seconds each
process used, and the machine. Every loop is bounded in count and time; loopback only.

    python bench/load_state.py                               # 256 workers, 120 s at 1000 req/s
    python bench/load_state.py --duration-s 30 --rate 0      # closed loop: as fast as it goes

`tests/test_load_state.py` runs the same code for 30 s and asserts that nothing failed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import subprocess
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

from bench.agent_host import TOKEN as AGENT_TOKEN  # noqa: E402  (after the sys.path line)
from bench.common import raise_fd_limit  # noqa: E402
from bench.fleet import write_checkpoint  # noqa: E402


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen
    log: Path

    def cpu_s(self) -> float | None:
        """User + system CPU seconds of the process so far (Linux /proc)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _wait_file(path: Path, proc: Proc, deadline_s: float) -> str:
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.proc.returncode}; see {proc.log}:\n"
                               + proc.log.read_text(errors="replace")[-3000:])
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} not ready within {deadline_s:g}s; see {proc.log}")
        time.sleep(0.1)
    return path.read_text()


def start_hosts(workers: int, hosts: int, workdir: Path, latency_s: float) -> tuple[list[Proc], list[int]]:
    per = -(-workers // hosts)
    procs: list[tuple[Proc, Path]] = []
    for h in range(hosts):
        first, count = h * per, min(per, workers - h * per)
        if count <= 0:
            break
        ready, log = workdir / f"host-{h}.json", workdir / f"host-{h}.log"
        proc = subprocess.Popen([sys.executable, "-m", "bench.agent_host", "--count", str(count),
                                 "--first", str(first), "--root", str(workdir), "--latency-s", str(latency_s),
                                 "--ready", str(ready), "--require-desired-version"], cwd=REPO,
                                stdin=subprocess.PIPE,
                                stdout=log.open("wb"), stderr=subprocess.STDOUT)
        procs.append((Proc(f"host-{h}", proc, log), ready))
    ports: list[int] = []
    for proc, ready in procs:
        ports += json.loads(_wait_file(ready, proc, 120))["ports"]
    return [p for p, _ in procs], ports


def start_controller(ports: list[int], workdir: Path, poll_interval_s: float) -> tuple[Proc, str]:
    import yaml

    config = {
        "controller_id": "load", "api": {"host": "127.0.0.1", "port": 0, "token": CTL_TOKEN},
        "discovery": {"kind": "static", "static": [
            {"id": f"w{i:04d}", "admin_url": f"http://127.0.0.1:{port}", "flavor": "agent"}
            for i, port in enumerate(ports)]},
        "workers": {"token": AGENT_TOKEN, "timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 120},
        "reconcile": {"poll_interval_s": poll_interval_s, "interval_s": 1.0},
        "store": {"kind": "file", "path": str(workdir / "store" / "desired.json")},
        "allowed_roots": [str(workdir)], "log_format": "json", "log_level": "warning",
    }
    (workdir / "controller.yaml").write_text(yaml.safe_dump(config))
    port_file, log = workdir / "controller.port", workdir / "controller.log"
    proc = subprocess.Popen([sys.executable, "-m", "controlplane", "--config", str(workdir / "controller.yaml"),
                             "--port-file", str(port_file)], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    p = Proc("controller", proc, log)
    return p, f"http://127.0.0.1:{int(_wait_file(port_file, p, 60))}"


# -- load and cycles ------------------------------------------------------------------------------------
@dataclass
class LoadStats:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    behind: int = 0  # sends more than 50 ms behind their loop's schedule
    body_bytes: int = 0
    checked: int = 0  # bodies parsed and checked
    error_count: int = 0

    def error(self, what: str) -> None:
        self.error_count += 1
        if len(self.errors) < 20:
            self.errors.append(what)
        else:
            self.errors[-1] = f"... and more; last: {what}"


async def generate_load(url: str, *, rate: float, concurrency: int, duration_s: float, workers: int,
                        stats: LoadStats) -> float:
    """`concurrency` loops sharing one pool, paced to `rate` requests/s in total (0: no pacing).
    Every 50th body is parsed and checked (a state of every member); returns the time taken."""
    import aiohttp

    ticket = itertools.count()
    start = time.monotonic()
    stop_at = start + duration_s

    async def loop(session: aiohttp.ClientSession) -> None:
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
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    body = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                stats.error(f"{type(exc).__name__}: {exc}")
                continue
            stats.latencies.append(time.perf_counter() - t0)
            stats.body_bytes += len(body)
            if status != 200:
                stats.error(f"HTTP {status}: {body[:200]!r}")
            elif n % 50 == 0:
                doc = json.loads(body)
                stats.checked += 1
                if len(doc["workers"]) != workers or "phase" not in doc:
                    stats.error(f"a state with {len(doc['workers'])} workers, phase {doc.get('phase')!r}")

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
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
            body = {"version": f"load-{k}", "source": {"kind": "disk", "path": str(ckpts[k % len(ckpts)])},
                    "pause_mode": "keep"}
            t0 = time.monotonic()
            try:
                async with session.post(url + "/v1/rl/update_weights", json=body, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=300)) as resp:
                    doc = await resp.json()
                    results.append({"version": body["version"], "http": resp.status, "status": doc.get("status"),
                                    "duration_s": round(time.monotonic() - t0, 3),
                                    "failed": [r["worker_id"] for r in doc.get("results", [])
                                               if r["status"] not in ("ok", "skipped")][:10]})
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                results.append({"version": body["version"], "http": None, "status": f"{type(exc).__name__}: {exc}",
                                "duration_s": round(time.monotonic() - t0, 3), "failed": []})


async def wait_reachable(url: str, workers: int, timeout_s: float) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + "/v1/rl/state", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                doc = await resp.json()
            if len(doc["workers"]) == workers and all(w["reachable"] for w in doc["workers"]):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {sum(w['reachable'] for w in doc['workers'])} of {workers} reachable")
            await asyncio.sleep(0.5)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet and the controller, run cycles and load together, stop everything."""
    raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="load-state-") as tmp:
        workdir = Path(tmp)
        ckpts = [write_checkpoint(workdir / f"ckpt-{seed}", seed) for seed in (1, 2, 3)]
        procs: list[Proc] = []
        try:
            t0 = time.monotonic()
            hosts, ports = await asyncio.to_thread(start_hosts, args.workers, args.hosts, workdir, args.latency_s)
            procs += hosts
            controller, url = await asyncio.to_thread(start_controller, ports, workdir, args.poll_interval_s)
            procs.append(controller)
            await wait_reachable(url, args.workers, timeout_s=120)
            setup_s = time.monotonic() - t0

            cpu_before = {p.name: p.cpu_s() for p in procs}
            self_before = time.process_time()
            stats, cycles, stop = LoadStats(), [], asyncio.Event()
            cycler = asyncio.create_task(run_cycles(url, ckpts, stop, cycles), name="update-cycles")
            took = await generate_load(url + "/v1/rl/state", rate=args.rate, concurrency=args.concurrency,
                                       duration_s=args.duration_s, workers=args.workers, stats=stats)
            cpu = {p.name: round((p.cpu_s() or 0) - (cpu_before[p.name] or 0), 2) for p in procs}
            cpu["load_generator_and_cycles"] = round(time.process_time() - self_before, 2)
            stop.set()
            await asyncio.wait_for(cycler, 300)
        finally:
            for p in procs:
                p.stop()
        lat = sorted(stats.latencies)
        ok_cycles = [c for c in cycles if c["http"] == 200 and c["status"] == "ok"]
        cycle_times = sorted(c["duration_s"] for c in ok_cycles)
        return {
            "workers": args.workers, "hosts": args.hosts, "duration_s": round(took, 2), "target_rate": args.rate,
            "concurrency": args.concurrency, "poll_interval_s": args.poll_interval_s,
            "engine_op_latency_s": args.latency_s, "setup_s": round(setup_s, 1),
            "requests": len(lat), "errors": stats.error_count, "error_samples": stats.errors,
            "rps": round(len(lat) / took, 1) if took else 0.0,
            "latency_ms": {name: round(_percentile(lat, q) * 1e3, 2) for name, q in
                           (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0))},
            "late_sends": stats.behind, "bodies_checked": stats.checked,
            "mean_body_kib": round(stats.body_bytes / max(1, len(lat)) / 1024, 1),
            "cycles": {"run": len(cycles), "ok": len(ok_cycles), "failed": [c for c in cycles if c not in ok_cycles],
                       "p50_s": _percentile(cycle_times, 0.5) if cycle_times else None},
            "cpu_s": cpu,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
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
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON report")
    return p.parse_args(argv)


def report(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    lat = result["latency_ms"]
    print(f"GET /v1/rl/state, {result['workers']} workers, {result['duration_s']:g} s, "
          f"{result['cycles']['run']} update cycles ({result['cycles']['ok']} ok, p50 {result['cycles']['p50_s']} s)")
    print(f"  {result['requests']} requests, {result['errors']} errors, {result['rps']:g} req/s "
          f"(target {result['target_rate']:g}), p50 {lat['p50']} ms, p90 {lat['p90']} ms, p99 {lat['p99']} ms, "
          f"max {lat['max']} ms, body {result['mean_body_kib']} KiB")
    print(f"  CPU seconds: {result['cpu_s']}   (written to {out})")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = asyncio.run(measure(args))
    report(result, args.out)
    return result


if __name__ == "__main__":
    main()

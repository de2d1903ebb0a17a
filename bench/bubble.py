"""`python -m bench.bubble`: how much of the fleet serves through a weight update, all at once vs rolling.

Real processes, as `python -m rlcp.localfleet` runs them: N agents (SimEngines whose disk load takes
`--load-s` seconds, a real model's reload time; or real vLLM CPU engines with `--vllm`), the
controller with its inference gateway, and here the trainer and the rollout load: `--streams`
closed-loop clients through the gateway, enough to fill every engine's slots, so that a member
out of service shows as lost throughput.

Each case (`STRATEGY[/MAX_UNAVAILABLE]@STALENESS`, e.g. `rolling/1@1`) sets the gateway's
staleness bound, lets the load run steady for `--steady-s` (the baseline, in the same run), then
runs one update under the load. Reported per case:
- rollout throughput during the update ÷ the steady throughput just before it (the served
  capacity, as the rollouts saw it), and the p50/p99 latency of rollouts in flight at some
  moment of the update, against those of the steady window;
- the controller's own bubble report (members serving at least, mean capacity, worker-seconds
  out of service);
- the fence: every answer's `X-RL-Weight-Version` must be a version the fence admitted at some
  moment between the request's send and its answer (the desired version from the moment it was
  switched, older ones only within the staleness bound). Answers outside it are counted, and
  must be zero; so are failed rollouts.

    python -m bench.bubble                       # 4 sim agents, 3 s reloads, four cases
    python -m bench.bubble --vllm --agents 2     # real vLLM CPU engines (tiny model)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import plot, quiet_logs, report, table
from rlcp.controlplane.fleet.desired import admitted_versions
from rlcp.localfleet.options import parse_args
from rlcp.localfleet.processes import FleetError, Processes
from rlcp.localfleet.start import start_fleet
from rlcp.localfleet.trainers import write_step_weights

PROMPTS = ["The quick brown fox", "Reinforcement learning updates", "A fleet of inference engines"]
DEFAULT_CASES = "all_at_once@1,rolling/1@1,rolling/1@0,rolling/50%@1"


@dataclass(frozen=True)
class Case:
    name: str
    strategy: dict[str, Any]
    staleness: int

    @classmethod
    def parse(cls, text: str) -> Case:
        how, _, bound = text.partition("@")
        kind, _, max_unavailable = how.partition("/")
        if kind == "all_at_once" and not max_unavailable:
            strategy: dict[str, Any] = {"type": "all_at_once"}
        elif kind == "rolling" and max_unavailable:
            count = max_unavailable if max_unavailable.endswith("%") else int(max_unavailable)
            strategy = {"type": "rolling", "max_unavailable": count}
        else:
            raise ValueError(f"case {text!r}: expected all_at_once@K or rolling/N@K (N a count or a percentage)")
        return cls(text, strategy, int(bound or 0))


@dataclass
class Answer:
    sent: float
    done: float
    ok: bool
    version: str | None


@dataclass
class Load:
    """Closed-loop rollouts through the gateway; every answer recorded."""

    session: aiohttp.ClientSession
    gateway: str
    model: str
    max_tokens: int
    answers: list[Answer] = field(default_factory=list)

    async def stream(self, i: int) -> None:
        while True:
            body = {"model": self.model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": self.max_tokens}
            sent = time.time()
            try:
                async with self.session.post(
                    f"{self.gateway}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=120)
                ) as resp:
                    await resp.read()
                    ok, version = resp.status == 200, resp.headers.get("X-RL-Weight-Version")
            except (aiohttp.ClientError, TimeoutError):
                ok, version = False, None
            self.answers.append(Answer(sent, time.time(), ok, version))
            if not ok:
                await asyncio.sleep(0.05)
            i += 1


@dataclass
class Controller:
    session: aiohttp.ClientSession
    url: str
    token: str

    async def call(self, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
        async with self.session.request(
            method,
            self.url + path,
            json=body,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            data = await resp.json(content_type=None)
            if resp.status >= 300:
                raise FleetError(f"{method} {path}: {resp.status} {str(data)[:500]}")
            return data


class Fence:
    """What the fence admitted over time: (from, admitted versions), in order."""

    def __init__(self, initial: list[str] | None) -> None:
        self.times: list[float] = [0.0]
        self.sets: list[set[str] | None] = [set(initial) if initial else None]  # None: any (nothing desired)

    def change(self, at: float, desired: str | None, applied: list[str], bound: int) -> None:
        i = bisect.bisect(self.times, at)
        self.times.insert(i, at)
        self.sets.insert(i, set(admitted_versions(desired, applied, bound)) or None)

    def admits(self, answer: Answer) -> bool:
        first = bisect.bisect(self.times, answer.sent) - 1
        last = bisect.bisect(self.times, answer.done) - 1
        return any(s is None or answer.version in s for s in self.sets[max(first, 0) : last + 1])


def rate(answers: list[Answer], start: float, end: float) -> float:
    done = sum(1 for a in answers if a.ok and start <= a.done < end)
    return done / (end - start) if end > start else 0.0


def p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cases = [Case.parse(c) for c in args.cases.split(",")]
    base = None
    if args.vllm:
        from rlcp.harness.tiny_model import make_model_family

        make_model_family(workdir / "models")
        base = workdir / "models" / "base"
    for sub in ("logs", "run", "state", "steps"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    # The local fleet's own options (its parser's defaults: no LoRA, the Python gateway), so a
    # flag it gains later has its default here too.
    fleet_args = parse_args(
        [
            *([] if args.vllm else ["--sim"]),
            *("--agents", str(args.agents), "--workdir", str(workdir), "--port", "0", "--gateway-port", "0"),
            *("--start-timeout", str(args.start_timeout)),
            *("--sim-load-s", str(args.load_s), "--sim-token-s", str(args.token_s)),
        ]
    )
    procs = Processes(workdir)
    try:
        specs, url, token = await start_fleet(fleet_args, procs, base)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return await run_cases(args, cases, Controller(session, url, token), session, base, workdir)
    finally:
        procs.stop()


async def run_cases(
    args: argparse.Namespace,
    cases: list[Case],
    ctl: Controller,
    session: aiohttp.ClientSession,
    base: Path | None,
    workdir: Path,
) -> dict[str, Any]:
    deadline = time.monotonic() + args.start_timeout
    while True:
        state = await ctl.call("GET", "/v1/rl/state")
        if state["workers"] and all(w["ready"] for w in state["workers"]) and state.get("gateway"):
            break
        if time.monotonic() > deadline:
            raise FleetError("the fleet did not become ready")
        await asyncio.sleep(0.25)
    # A first update puts the fleet at a version the controller applied (the engines' own
    # start-up version is one the staleness bound can never admit).
    await ctl.call(
        "POST",
        "/v1/rl/update_weights",
        {"version": "v0", "source": {"kind": "disk", "path": str(write_step_weights(workdir, 0, base))}},
        timeout_s=600,
    )
    fence = Fence(["v0"])
    load = Load(session, state["gateway"]["url"], "sim" if base is None else "tiny", args.max_tokens)
    streams = [asyncio.create_task(load.stream(i)) for i in range(args.streams)]
    rows: list[dict[str, Any]] = []
    try:
        desired, applied = "v0", ["v0"]
        for k, case in enumerate(cases, start=1):
            at = time.time()
            await ctl.call("POST", "/v1/rl/gateway/staleness", {"bound": case.staleness})
            fence.change(at, desired, applied, case.staleness)
            steady_from = time.time()
            await asyncio.sleep(args.steady_s)
            version, path = f"v{k}", write_step_weights(workdir, k, base)
            t0 = time.time()
            result = await ctl.call(
                "POST",
                "/v1/rl/update_weights",
                {
                    "version": version,
                    "source": {"kind": "disk", "path": str(path)},
                    "strategy": case.strategy,
                    "pause_mode": args.pause_mode,
                },
                timeout_s=1200,
            )
            t1 = time.time()
            state = await ctl.call("GET", "/v1/rl/state")
            desired, applied = version, state["desired"]["applied_versions"]
            switched = datetime.fromisoformat(state["desired"]["updated_at"]).timestamp()
            fence.change(switched, desired, applied, case.staleness)
            rows.append(
                {
                    "case": case.name,
                    "strategy": case.strategy,
                    "staleness": case.staleness,
                    "status": result["status"],
                    "t0": t0,
                    "t1": t1,
                    "steady_from": steady_from,
                    "switched": switched,
                    "bubble": result["bubble"],
                    "progress": result["progress"],
                }
            )
        await asyncio.sleep(args.steady_s)
    finally:
        for s in streams:
            s.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    return analyse(args, rows, load.answers, fence)


def analyse(
    args: argparse.Namespace, rows: list[dict[str, Any]], answers: list[Answer], fence: Fence
) -> dict[str, Any]:
    outside = [a for a in answers if a.ok and not fence.admits(a)]
    for row in rows:
        t0, t1 = row["t0"], row["t1"]
        steady = rate(answers, row["steady_from"], t0)
        during = [a for a in answers if a.sent < t1 and a.done > t0]  # in flight at some moment of it
        calm = [a for a in answers if row["steady_from"] <= a.sent and a.done < t0]
        row |= {
            "update_s": round(t1 - t0, 3),
            "steady_per_s": round(steady, 2),
            "during_per_s": round(rate(answers, t0, t1), 2),
            "throughput_ratio": round(rate(answers, t0, t1) / steady, 3) if steady else None,
            "p50_steady_s": p50([a.done - a.sent for a in calm if a.ok]),
            "p99_steady_s": p99([a.done - a.sent for a in calm if a.ok]),
            "p50_during_s": p50([a.done - a.sent for a in during if a.ok]),
            "p99_during_s": p99([a.done - a.sent for a in during if a.ok]),
            "failed": sum(1 for a in during if not a.ok),
            "outside_fence": sum(1 for a in during if a.ok and not fence.admits(a)),
            # Completions per bin over the update, ÷ the steady rate: the plot.
            "timeline": timeline(answers, t0 - 1.0, t1 + 1.0, steady, args.bin_s),
        }
    return {
        "agents": args.agents,
        "engine": "vllm" if args.vllm else "sim",
        "load_s": args.load_s,
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "pause_mode": args.pause_mode,
        "answers": len(answers),
        "failed": sum(1 for a in answers if not a.ok),
        "outside_fence": len(outside),
        "rows": rows,
    }


def timeline(
    answers: list[Answer], start: float, end: float, steady: float, step_s: float, window_s: float = 1.0
) -> list[list[float]]:
    """Completions per second over a sliding `window_s`, ÷ the steady rate, every `step_s` from
    `start` (1 s before the update) to `end`: closed-loop clients finish in waves, so a bin
    much shorter than a request would show the waves, not the capacity."""
    points = []
    t = start
    while t < end:
        r = rate(answers, t - window_s / 2, t + window_s / 2)
        points.append([round(t - start - 1.0, 3), round(r / steady, 3) if steady else 0.0])
        t += step_s
    return points


def render(r: dict[str, Any]) -> str:
    rows = []
    for row in r["rows"]:
        b = row["bubble"] or {}
        rows.append(
            [
                row["case"],
                row["status"],
                row["update_s"],
                row["throughput_ratio"],
                b.get("mean_capacity"),
                f"{b.get('min_serving')}/{b.get('members')}",
                b.get("worker_seconds_out"),
                f"{_s(row['p50_steady_s'])} / {_s(row['p99_steady_s'])}",
                f"{_s(row['p50_during_s'])} / {_s(row['p99_during_s'])}",
                row["failed"],
                row["outside_fence"],
            ]
        )
    return table(
        [
            "case",
            "status",
            "update s",
            "throughput ÷ steady",
            "mean capacity (ctl)",
            "min serving",
            "worker-s out",
            "p50/p99 steady s",
            "p50/p99 during s",
            "failed",
            "outside fence",
        ],
        rows,
    )


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def draw(r: dict[str, Any], out: Path) -> Path:
    def d(ax: Any) -> None:
        for i, row in enumerate(r["rows"]):
            color = f"C{i}"
            xs, ys = zip(*row["timeline"], strict=True) if row["timeline"] else ((), ())
            ax.plot(xs, ys, color=color, lw=1.2, label=f"{row['case']}: rollouts ÷ steady")
            b = row["bubble"]
            if b:
                steps = [(p["t_s"], p["serving"] / b["members"]) for p in b["capacity"]]
                steps.append((row["update_s"], steps[-1][1]))
                ax.step(
                    [t for t, _ in steps],
                    [c for _, c in steps],
                    where="post",
                    color=color,
                    ls="--",
                    lw=1,
                    label=f"{row['case']}: members serving (controller)",
                )
        ax.set_xlabel("seconds since the update began")
        ax.set_ylabel("fraction of steady / of members")
        ax.set_ylim(-0.05, 1.6)
        ax.legend(fontsize=6, loc="upper right", ncol=2)
        ax.set_title(
            f"Update bubble: {r['agents']} {r['engine']} agents, reload {r['load_s']:g}s"
            if r["engine"] == "sim"
            else f"Update bubble: {r['agents']} vLLM CPU agents"
        )

    return plot("bubble" if r["engine"] == "sim" else "bubble_vllm", d, out, size=(8.0, 4.2))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--vllm", action="store_true", help="real vLLM CPU engines on the tiny model (not SimEngines)")
    p.add_argument("--load-s", type=float, default=3.0, help="sim: seconds a weight load takes")
    p.add_argument("--token-s", type=float, default=0.02, help="sim: seconds per generated token")
    p.add_argument(
        "--streams",
        type=int,
        default=None,
        help="rollout clients (default: 8 per sim agent, 4 per vLLM agent: every engine's slots full)",
    )
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated (default {DEFAULT_CASES})")
    p.add_argument("--pause-mode", choices=("abort", "wait", "keep"), default="keep")
    p.add_argument("--steady-s", type=float, default=3.0, help="steady load before each update (the baseline)")
    p.add_argument("--bin-s", type=float, default=0.25, help="the plot's step (a 1 s sliding window)")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    a = p.parse_args(argv)
    if a.streams is None:
        a.streams = a.agents * (4 if a.vllm else 8)
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="bench-bubble-") as tmp:
        result = asyncio.run(measure(a, Path(tmp)))
    return report(
        "bubble" if not a.vllm else "bubble_vllm",
        result,
        a.out,
        text=render(result),
        draw=lambda out: draw(result, out),
    )


if __name__ == "__main__":
    main()

"""`python -m bench.ray_discovery`: what one discovery poll of a Ray cluster costs, by actor count.

A real Ray head on loopback (`rlcp.harness.raycluster`) and a plain Ray driver (this process)
placing `--live` engine actors whose `__repr__` follows the convention (docs/ray.md), then more
actors that can never be scheduled (a custom resource nobody has) up to each size in `--sizes`:
they are rows of the state API's answer like any actor, without a worker process each (a live
actor is a ~93 MB process: 256 of them would not fit on this machine). Per size:
- `poll`: `RayActorSource.poll()`, what the controller does every `interval_s` (one GET under a
  deadline, the JSON read, `parse_actors`, the skip log);
- `bare`: the same GET with the answer read and `json.loads`ed, nothing else, on the same
  session: what any client of the state API pays. The ratio poll / bare is our code's share.
Then `parse_actors` over `--members` members (rows of a real answer, renamed), the parse a
cluster of that many live engines costs on top of the GET; and the head's memory (RSS summed
over its processes) idle and with the actors.

    python -m bench.ray_discovery                          # 16 live, sizes 16,64,256, 256 members
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import machine, median, plot, quiet_logs, report, table
from rlcp.controlplane.discovery.ray import RayActorSource, actors_url, parse_actors, query
from rlcp.harness.raycluster import RayHead

NAMESPACE, PREFIX = "rlcp-bench-disc", "rlcp-engine-"


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return round(total / 1024, 1)


def engine_class(ray: Any) -> Any:
    """An engine actor as a framework would write it (pickled by value: the workers need not
    import this module)."""

    class Engine:
        def __init__(self, index: int) -> None:
            self.described = {
                "rlcp": 1,
                "admin_url": f"http://127.0.0.1:{20000 + index}",
                "inference_url": f"http://127.0.0.1:{30000 + index}",
                "flavor": "agent",
                "world_size": 1,
                "model": "sim",
            }

        def __repr__(self) -> str:
            return json.dumps(self.described)

        def pid(self) -> int:
            return os.getpid()

    return Engine


async def time_calls(fn: Any, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


async def measure_polls(head: RayHead, repeats: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        source = RayActorSource(
            session=session, dashboard_url=head.dashboard_url, namespace=NAMESPACE, name_prefix=PREFIX, timeout_s=10
        )
        url, params = actors_url(head.dashboard_url), query(namespace=NAMESPACE, class_name=None, limit=10000)
        body: dict[str, Any] = {}

        async def bare() -> None:
            async with session.get(url, params=params, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                raw = await resp.read()
                body["bytes"] = len(raw)
                body["rows"] = len(json.loads(raw)["data"]["result"]["result"])

        async def poll() -> None:
            body["members"] = len(await source.poll())

        await bare()  # warm: connection, first parse
        await poll()
        polls, bares = [], []
        for _ in range(repeats):  # interleaved, so drift on a shared machine hits both alike
            polls += await time_calls(poll, 1)
            bares += await time_calls(bare, 1)
        return {
            "rows": body["rows"],
            "members": body["members"],
            "answer_kb": round(body["bytes"] / 1024, 1),
            "poll_ms": round(median(polls) * 1e3, 2),
            "poll_p90_ms": round(p90(polls) * 1e3, 2),
            "bare_ms": round(median(bares) * 1e3, 2),
            "bare_p90_ms": round(p90(bares) * 1e3, 2),
            "ratio_poll_vs_bare": round(median(polls) / median(bares), 2),
        }


def members_answer(live_answer: dict[str, Any], n: int) -> dict[str, Any]:
    """A state API answer of `n` live engines: the live rows of a real answer, renamed."""
    rows = [r for r in live_answer["data"]["result"]["result"] if r.get("repr_name")]
    out = []
    for i in range(n):
        row = copy.deepcopy(rows[i % len(rows)])
        row["name"], row["actor_id"] = f"{PREFIX}{i}", f"{i:032x}"
        out.append(row)
    answer = copy.deepcopy(live_answer)
    result = answer["data"]["result"]
    result["result"], result["total"], result["num_after_truncation"] = out, n, n
    result["num_filtered"] = n
    return answer


def measure(args: argparse.Namespace) -> dict[str, Any]:
    # Before `import ray`, which reads it: without it Ray turns 127.0.0.1 into the machine's address.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    head = RayHead(num_cpus=2).start()
    try:
        time.sleep(2.0)  # the head's own start-up work settles before its memory is read
        idle_mb = rss_mb(head.pids())
        ray.init(
            address=head.gcs_address,
            namespace=NAMESPACE,
            logging_level="warning",
            log_to_driver=False,
            configure_logging=False,
        )
        Engine = ray.remote(num_cpus=0)(engine_class(ray))
        t0 = time.monotonic()
        live = [Engine.options(name=f"{PREFIX}live-{i}", lifetime="detached").remote(i) for i in range(args.live)]
        ray.get([a.pid.remote() for a in live], timeout=300)
        live_s = time.monotonic() - t0
        live_mb = rss_mb(head.pids())
        pending: list[Any] = []
        rows = []
        for size in args.sizes:
            for i in range(len(pending), size - args.live):
                pending.append(
                    Engine.options(name=f"{PREFIX}pending-{i}", lifetime="detached", resources={"nowhere": 1}).remote(
                        10000 + i
                    )
                )
            time.sleep(1.0)  # the GCS has registered them (they stay PENDING_CREATION)
            rows.append({"size": size, **asyncio.run(measure_polls(head, args.repeats))})

        import urllib.request

        with urllib.request.urlopen(
            f"{head.dashboard_url}/api/v0/actors?detail=true&limit=10000"
            f"&filter_keys=ray_namespace&filter_predicates=%3D&filter_values={NAMESPACE}",
            timeout=10,
        ) as resp:
            answer = members_answer(json.load(resp), args.members)
        parse_s = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            found = parse_actors(answer, namespace=NAMESPACE, name_prefix=PREFIX)
            parse_s.append(time.perf_counter() - t0)
        assert len(found.specs) == args.members, (len(found.specs), found.skipped[:3])
        ray.shutdown()
    finally:
        head.stop()
    return {
        "live": args.live,
        "live_created_s": round(live_s, 2),
        "rows": rows,
        "parse": {
            "members": args.members,
            "median_ms": round(median(parse_s) * 1e3, 2),
            "per_member_us": round(median(parse_s) / args.members * 1e6, 1),
            "answer_kb": round(len(json.dumps(answer)) / 1024, 1),
        },
        "head_rss_mb": {
            "idle": idle_mb,
            "with_live_actors": live_mb,
            "per_live_actor": round((live_mb - idle_mb) / max(args.live, 1), 1),
        },
        "repeats": args.repeats,
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.ray_discovery", description=__doc__.splitlines()[0])
    p.add_argument("--live", type=int, default=16, help="live engine actors (a process each)")
    p.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[16, 64, 256],
        help="actor rows per step: live plus never-scheduled ones",
    )
    p.add_argument("--members", type=int, default=256, help="members in the parse measurement")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if any(size < args.live for size in args.sizes):
        p.error("every size must be at least --live")
    quiet_logs()  # each never-scheduled actor is a skip warning on the first poll
    result = measure(args)
    text = table(
        ["actors (rows)", "members", "answer KB", "poll median / p90 ms", "bare GET median / p90 ms", "poll / bare"],
        [
            [
                r["size"],
                r["members"],
                r["answer_kb"],
                f"{r['poll_ms']} / {r['poll_p90_ms']}",
                f"{r['bare_ms']} / {r['bare_p90_ms']}",
                r["ratio_poll_vs_bare"],
            ]
            for r in result["rows"]
        ],
    )
    parse, mem = result["parse"], result["head_rss_mb"]

    def draw(out_dir: Path) -> Path:
        def axes(ax: Any) -> None:
            sizes = [r["size"] for r in result["rows"]]
            ax.plot(sizes, [r["poll_ms"] for r in result["rows"]], marker="o", label="RayActorSource.poll")
            ax.plot(sizes, [r["bare_ms"] for r in result["rows"]], marker="o", label="bare GET + json.loads")
            ax.set_xlabel("actors in the namespace (rows)")
            ax.set_ylabel("ms (median)")
            ax.set_title(f"Ray discovery poll ({result['live']} live engines)")
            ax.legend()

        return plot("ray_discovery", axes, out_dir)

    return report(
        "ray_discovery",
        result,
        args.out,
        text=text,
        draw=draw,
        notes_after=[
            f"parse_actors over {parse['members']} live members ({parse['answer_kb']} KB): {parse['median_ms']} ms "
            f"({parse['per_member_us']} us a member)",
            f"head RSS: {mem['idle']} MB idle, {mem['with_live_actors']} MB with {result['live']} live actors "
            f"({mem['per_live_actor']} MB each; created in {result['live_created_s']} s)",
        ],
    )


if __name__ == "__main__":
    main()

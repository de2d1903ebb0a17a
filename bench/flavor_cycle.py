"""`python -m bench.flavor_cycle`: one update cycle through the controller, per flavor.

The same tiny Llama (`rlcp.harness.tiny_model`) behind each flavor, two workers per fleet, each
fleet driven by its own in-process controller: `POST /v1/rl/update_weights` from disk,
pause `keep`, verify on, alternating between two weight sets so every cycle really
reloads. Figures are the medians of `--repeats` cycles, the flavors interleaved cycle by
cycle so that load from others on the machine hits them alike, and reported as ratios to
the `agent` flavor measured in the same run.

- `agent`: `python -m rlcp.agent` on a vLLM CPU engine (one admin call per step, readiness
  gated on the desired version);
- `vllm`: stock `vllm serve` in dev mode (`rlcp.harness.processes.VllmServeProcess`): status from
  five reads, the disk update composed of three calls;
- `dynamo`: two workers of Dynamo 1.6.1's own software (`python -m dynamo.vllm`, Dynamo's own
  worker entry, on a vLLM CPU engine: `rlcp.harness.dynamo.DynamoVllmProcess`), as static specs
  with flavor dynamo (their system ports): status from three reads, a reload refused unless
  paused first.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from bench.common import median, quiet_logs, table, write_json
from rlcp.controlplane.assembly import assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings, update_body
from rlcp.harness.processes import AgentProcess, ChildProcess, VllmServeProcess, stop_all
from rlcp.harness.tiny_model import agent_engine

AGENT_TOKEN = "bench-agent-token"
# A fleet: (worker specs for the controller, the processes behind them, the workers' admin token).
Fleet = tuple[list[dict[str, Any]], list[ChildProcess], str]


def agent_fleet(models: dict[str, Path], workdir: Path) -> Fleet:
    def config(i: int) -> dict[str, Any]:
        return {"agent_id": f"agent-{i}", "allowed_roots": [str(models["base"].parent)], "log_format": "json",
                "log_level": "warning",
                "engine": agent_engine(models["base"])}

    procs = [AgentProcess(config(i), workdir / f"agent-{i}", name=f"agent-{i}", token=AGENT_TOKEN,
                          start_timeout_s=300) for i in range(2)]
    specs = [{"id": f"agent-{i}", "admin_url": p.admin_url, "inference_url": p.inference_url, "flavor": "agent"}
             for i, p in enumerate(_start(procs))]
    return specs, procs, AGENT_TOKEN


def vllm_fleet(models: dict[str, Path], workdir: Path) -> Fleet:
    procs = [VllmServeProcess(models["base"], workdir / f"vllm-{i}", name=f"vllm-{i}", core=i) for i in range(2)]
    return [p.spec(f"vllm-{i}") for i, p in enumerate(_start(procs))], procs, "unused-by-stock-vllm"


def dynamo_fleet(models: dict[str, Path], workdir: Path) -> Fleet:
    from rlcp.harness.dynamo import DynamoVllmProcess, dynamo_target

    target, kv = dynamo_target(), workdir / "kv"
    kv.mkdir(parents=True, exist_ok=True)
    procs = [DynamoVllmProcess(models["base"], workdir / f"dynamo-{i}", target=target, kv_dir=kv,
                               name=f"dynamo-{i}", core=i) for i in range(2)]
    specs = [{"id": f"dynamo-{i}", "admin_url": p.url, "flavor": "dynamo"} for i, p in enumerate(_start(procs))]
    return specs, procs, "unused-by-dynamo"


# flavor -> a function starting its fleet; None: not wired yet.
FLEETS: dict[str, Callable[[dict[str, Path], Path], Fleet] | None] = {
    "agent": agent_fleet, "vllm": vllm_fleet, "dynamo": dynamo_fleet,
}


def _start(procs: list[Any]) -> list[Any]:
    for p in procs:
        p.spawn()
    for p in procs:
        p.wait_ready()
    return procs


async def cycle(client: TestClient, models: dict[str, Path], n: int) -> float:
    """One update transaction; returns its wall time in seconds."""
    seed = 2 if n % 2 == 0 else 1
    t0 = time.perf_counter()
    resp = await client.post("/v1/rl/update_weights", headers=AUTH, json=update_body(
        f"cycle-{n}", models[f"weights-{seed}"], pause_mode="keep", verify=True))
    body = await resp.json()
    elapsed = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"update cycle {n} answered {resp.status}: {body}")
    return elapsed


async def run(flavors: list[str], repeats: int, workdir: Path) -> dict[str, Any]:
    from rlcp.harness.tiny_model import make_model_family

    models = make_model_family(workdir / "models")
    fleets: dict[str, Fleet] = {}
    clients: dict[str, TestClient] = {}
    try:
        for flavor in flavors:
            start = FLEETS[flavor]
            if start is None:
                print(f"flavor_cycle: no fleet for {flavor!r} yet (FLEETS[{flavor!r}] is None); skipped")
                continue
            t0 = time.perf_counter()
            fleets[flavor] = start(models, workdir / flavor)
            print(f"flavor_cycle: {flavor} fleet up in {time.perf_counter() - t0:.1f}s")
            specs, _, token = fleets[flavor]
            settings = controller_settings(
                workdir / f"ctl-{flavor}", specs, allowed_roots=[str(models["base"].parent)],
                log_level="error",
                workers={"token": token, "timeout_s": 30, "pause_timeout_s": 60, "weight_load_timeout_s": 120},
                reconcile={"poll_interval_s": 0.1, "interval_s": 0.1, "backoff_initial_s": 0.5, "backoff_max_s": 5})
            clients[flavor] = TestClient(TestServer(assemble(settings, token=CTL_TOKEN)))
            await clients[flavor].start_server()
        times: dict[str, list[float]] = {f: [] for f in clients}
        for n in range(repeats + 1):  # the first round warms every fleet up
            for flavor, client in clients.items():
                elapsed = await cycle(client, models, n)
                if n:
                    times[flavor].append(elapsed)
        return {f: {"median_s": median(t), "min_s": min(t), "max_s": max(t), "cycles_s": t}
                for f, t in times.items()}
    finally:
        for client in clients.values():
            await client.close()
        stop_all([p for _, procs, _ in fleets.values() for p in procs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavors", default="agent,vllm,dynamo", help="comma-separated; agent is the baseline")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    flavors = [f.strip() for f in args.flavors.split(",") if f.strip()]
    if "agent" not in flavors:
        flavors.insert(0, "agent")
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="flavor-cycle-") as tmp:
        figures = asyncio.run(run(flavors, args.repeats, Path(tmp)))
    base = figures["agent"]["median_s"]
    rows = [(f, fig["median_s"] * 1e3, fig["min_s"] * 1e3, fig["max_s"] * 1e3, fig["median_s"] / base)
            for f, fig in figures.items()]
    print(table(["flavor", "median ms", "min ms", "max ms", "x agent"], rows))
    print("written to", write_json("flavor_cycle", {"repeats": args.repeats, "figures": figures}))


if __name__ == "__main__":
    main()

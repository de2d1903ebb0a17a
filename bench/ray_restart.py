"""`python -m bench.ray_restart`: a placed agent SIGKILLed, until it serves again, converged.

A real Ray head on loopback (`rlcp.harness.raycluster`), the controller (its own process) with
`placement.kind: ray` keeping `--agents` SimEngine agents as detached actors and
`discovery.kind: ray` finding them, one disk update to `v1`, then `--kills` times: SIGKILL one
actor's process (in turn) and time, from the kill,
- `ray_alive_s`: the state API shows the actor ALIVE again with `num_restarts` bumped (Ray's restart);
- `agent_up_s`: its repr names a new agent (the actor's `__init__` returned: the agent child started);
- `serving_s`: the controller's state shows it serving at `v1` on the new agent (discovery saw the
  restart, the reconciler loaded `v1` into it and told it the desired version, the status read
  saw it ready): from then on the gateway routes to it.
A simulated disk load takes `--load-s` (a real model's reload takes seconds to minutes).

    python -m bench.ray_restart                 # 2 agents, 5 kills, 0 s loads
    python -m bench.ray_restart --load-s 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import machine, median, plot, report, table
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import AUTH, controller_config, update_body
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.raycluster import RayHead
from rlcp.harness.simfleet import TEST_TIMEOUTS
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN

NAMESPACE, PREFIX = "rlcp-bench", "rlcp-agent-"


def actors(head: RayHead) -> dict[str, dict[str, Any]]:
    url = (
        f"{head.dashboard_url}/api/v0/actors?detail=true&limit=1000&filter_keys=ray_namespace"
        f"&filter_predicates=%3D&filter_values={NAMESPACE}"
    )
    with urllib.request.urlopen(url, timeout=5) as resp:
        rows = json.load(resp)["data"]["result"]["result"]
    return {r["name"]: r for r in rows if r.get("name", "").startswith(PREFIX) and r["state"] != "DEAD"}


async def until(probe: Any, timeout_s: float, what: str) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s:g}s: {what}")
        await asyncio.sleep(0.02)


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    head = RayHead(num_cpus=2).start()
    root = workdir / "weights"
    write_checkpoint(root / "v1", 1)
    agent = {
        "engine": {"kind": "sim", "model": "sim", "sim_load_latency_s": args.load_s},
        "admin": {"token": AGENT_TOKEN},
        "allowed_roots": [str(root)],
        "timeouts": TEST_TIMEOUTS,
        "log_format": "json",
        "log_level": "warning",
    }
    config = controller_config(
        workdir,
        [],
        [root],
        gateway={"port": 0},
        log_level="warning",
        **head.placed_fleet(
            NAMESPACE,
            PREFIX,
            agent,
            replicas=args.agents,
            bundle={"CPU": 0.5},
            discovery={"interval_s": 0.2, "timeout_s": 2.0, "max_backoff_s": 1.0},
            placement={"interval_s": 0.5},
        ),
    )
    ctl = ControllerProcess(config, workdir, start_timeout_s=90)
    rows: list[dict[str, float]] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def workers() -> list[dict[str, Any]]:
                async with http.get(f"{ctl.url}/v1/rl/state", headers=AUTH) as resp:
                    return list((await resp.json())["workers"])

            t0 = time.monotonic()
            await ctl.spawn().wait_ready_async()

            async def all_serving(version: str | None = None) -> bool:
                ws = await workers()
                return len(ws) == args.agents and all(
                    w["serving"] and (version is None or w["weight_version"] == version) for w in ws
                )

            placed_s = await until(all_serving, 120, "agents placed and serving") - t0
            async with http.post(
                f"{ctl.url}/v1/rl/update_weights", headers=AUTH, json=update_body("v1", root / "v1")
            ) as resp:
                assert resp.status == 200, await resp.text()
            await until(lambda: all_serving("v1"), 30, "v1 everywhere")
            for k in range(args.kills):
                name = f"{PREFIX}{k % args.agents}"
                before = actors(head)[name]
                old_url = next(w["admin_url"] for w in await workers() if w["id"] == name)

                async def anew(name: str = name, old_url: str = old_url) -> bool:
                    return await all_serving("v1") and any(
                        w["id"] == name and w["admin_url"] != old_url for w in await workers()
                    )

                t_kill = time.monotonic()
                os.kill(before["pid"], signal.SIGKILL)
                t_alive = await until(
                    lambda: (
                        (a := actors(head).get(name)) is not None
                        and a["state"] == "ALIVE"
                        and a["num_restarts"] > before["num_restarts"]
                    ),
                    30,
                    "Ray's restart",
                )
                t_up = await until(
                    lambda: (
                        (a := actors(head).get(name)) is not None
                        and a.get("repr_name")
                        and a["repr_name"] != before["repr_name"]
                    ),
                    30,
                    "agent up",
                )
                t_serving = await until(anew, 30, "converged and serving")
                rows.append(
                    {"ray_alive_s": t_alive - t_kill, "agent_up_s": t_up - t_kill, "serving_s": t_serving - t_kill}
                )
                await asyncio.sleep(0.5)
    finally:
        ctl.stop()
        head.stop()
    return {
        "agents": args.agents,
        "load_s": args.load_s,
        "placed_and_serving_s": placed_s,
        "kills": rows,
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.ray_restart", description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--load-s", type=float, default=0.0, help="seconds a simulated disk load takes")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    keys = ("ray_alive_s", "agent_up_s", "serving_s")
    text = table(
        ["from the SIGKILL", "median s", "max s"],
        [
            [k, f"{median([r[k] for r in result['kills']]):.2f}", f"{max(r[k] for r in result['kills']):.2f}"]
            for k in keys
        ],
    )

    def draw(out_dir: Path) -> Path:
        def axes(ax: Any) -> None:
            for i, key in enumerate(keys):
                ax.scatter([i] * len(result["kills"]), [r[key] for r in result["kills"]])
            ax.set_xticks(range(len(keys)), keys)
            ax.set_ylabel("seconds after the SIGKILL")
            ax.set_title(f"placed agent restart ({result['agents']} agents, load {result['load_s']:g} s)")

        return plot("ray_restart", axes, out_dir)

    return report(
        "ray_restart",
        result,
        args.out,
        text=text,
        draw=draw,
        notes_before=[
            f"{result['agents']} agents placed and serving after "
            f"{result['placed_and_serving_s']:.2f} s; {len(result['kills'])} kills"
        ],
    )


if __name__ == "__main__":
    main()

"""`python -m bench.gateway_dynamo`: what the gateway adds in front of Dynamo's own frontend.

Dynamo 1.6.1's own software (scripts/setup-dynamo.sh): two `python -m dynamo.vllm` workers on
vLLM CPU engines over the tiny model, and `python -m dynamo.frontend`. A controller in this
process finds the workers through the frontend's `GET /v1/rl/workers` listing and runs the
gateway, which pins every request to a fenced member with `nvext.backend_instance_id`.

In one run, against the same frontend and workers, one request at a time, interleaved:
- `frontend`: `POST /v1/chat/completions` straight to the frontend (its router picks);
- `frontend, pinned`: the same with `nvext.backend_instance_id` set by the client, the request
  the gateway sends (so the difference to `gateway` is the gateway's own cost);
- `gateway`: through the gateway.
Each request is tokens in (`nvext.token_data`), one token out, so the engine's time is small
and the same on every path; p50 and p99 of each, and the gateway's added p50 / p99.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import plot, quiet_logs, report, table
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.dynamo import DynamoFrontendProcess, DynamoVllmProcess, dynamo_target
from rlcp.harness.processes import stop_all
from rlcp.harness.tiny_model import make_model_family
from rlcp.harness.waiting import wait_for

PROMPT = [5, 17, 42, 99, 7, 200, 3, 64]


def _body(instance: int | None = None) -> dict[str, Any]:
    nvext: dict[str, Any] = {"token_data": PROMPT}
    if instance is not None:
        nvext["backend_instance_id"] = instance
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "-"}],
        "max_tokens": 1,
        "temperature": 0,
        "nvext": nvext,
    }


async def _one(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    models = make_model_family(work / "models")
    target = dynamo_target()
    kv = work / "kv"
    kv.mkdir()
    workers = [
        DynamoVllmProcess(models["base"], work / f"w{i}", target=target, kv_dir=kv, name=f"dynamo-vllm-{i}", core=i)
        for i in range(2)
    ]
    frontend = DynamoFrontendProcess(work / "frontend", target=target, kv_dir=kv)
    try:
        for child in (*workers, frontend):
            child.spawn()
        for child in (*workers, frontend):
            child.wait_ready()
        settings = controller_settings(
            work,
            [],
            allowed_roots=[str(models["base"].parent)],
            discovery={
                "kind": "http_listing",
                "http_listing": {
                    "url": frontend.listing_url,
                    "interval_s": 0.5,
                    "timeout_s": 5,
                    "default_flavor": "dynamo",
                    "inference_url": frontend.url,
                },
            },
            workers={"token": "unused", "timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 120},
            gateway={"port": 0},
        )
        runner = web.AppRunner(assemble(settings, token=CTL_TOKEN), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            app = runner.app
            gateway = app[GATEWAY]
            controller = app[CONTROLLER]

            def both_reachable() -> bool:
                members = controller.state().workers
                return len(members) == 2 and all(w.reachable for w in members)

            await wait_for(both_reachable, timeout_s=60, what="the controller reaching both listed workers")
            async with aiohttp.ClientSession() as http:
                ctl_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
                async with http.post(
                    ctl_url + "/v1/rl/update_weights",
                    headers=AUTH,
                    json={
                        "version": "w1",
                        "source": {"kind": "disk", "path": str(models["weights-1"])},
                        "pause_mode": "wait",
                    },
                ) as resp:
                    assert resp.status == 200, await resp.text()

                def both_inside() -> bool:
                    table_ = gateway.router.table()
                    return table_ is not None and len(table_.routes) == 2

                await wait_for(both_inside, timeout_s=120, what="both Dynamo workers inside the fence")
                fenced = gateway.router.table()
                assert fenced is not None  # both_inside saw it
                instance = int(next(iter(fenced.routes)))
                paths = {
                    "frontend": (frontend.url, _body()),
                    "frontend, pinned": (frontend.url, _body(instance)),
                    "gateway": (gateway.url, _body()),
                }
                lat: dict[str, list[float]] = {name: [] for name in paths}
                for name, (url, body) in paths.items():  # warm every path's connections and caches
                    for _ in range(10):
                        await _one(http, f"{url}/v1/chat/completions", body)
                for _ in range(args.requests):
                    for name, (url, body) in paths.items():
                        lat[name].append(await _one(http, f"{url}/v1/chat/completions", body))
        finally:
            await runner.cleanup()
    finally:
        stop_all([frontend, *workers])
    out: dict[str, Any] = {
        name: {"p50_ms": _pct(v, 50) * 1e3, "p99_ms": _pct(v, 99) * 1e3, "mean_ms": statistics.fmean(v) * 1e3}
        for name, v in lat.items()
    }
    for base in ("frontend", "frontend, pinned"):
        key = base.replace(", ", "_")
        out[f"added_p50_ms_vs_{key}"] = out["gateway"]["p50_ms"] - out[base]["p50_ms"]
        out[f"added_p99_ms_vs_{key}"] = out["gateway"]["p99_ms"] - out[base]["p99_ms"]
    out["requests_per_path"] = args.requests
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="bench.gateway_dynamo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200, help="sequential requests per path")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="bench-gateway-dynamo-") as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    return report("gateway_dynamo", result, args.out, text=render(result), draw=lambda out: draw(result, out))


def render(result: dict[str, Any]) -> str:
    names = ["frontend", "frontend, pinned", "gateway"]
    return table(
        ["path (one token out)", "p50 ms", "p99 ms", "mean ms"],
        [[n, result[n]["p50_ms"], result[n]["p99_ms"], result[n]["mean_ms"]] for n in names]
        + [
            [
                "added by the gateway (vs pinned)",
                result["added_p50_ms_vs_frontend_pinned"],
                result["added_p99_ms_vs_frontend_pinned"],
                None,
            ],
            [
                "added by the gateway (vs frontend)",
                result["added_p50_ms_vs_frontend"],
                result["added_p99_ms_vs_frontend"],
                None,
            ],
        ],
    )


def draw(result: dict[str, Any], out: Path) -> Path:
    names = ["frontend", "frontend, pinned", "gateway"]

    def bars(ax: Any) -> None:
        xs = list(range(len(names)))
        ax.bar([x - 0.175 for x in xs], [result[n]["p50_ms"] for n in names], width=0.35, label="p50")
        ax.bar([x + 0.175 for x in xs], [result[n]["p99_ms"] for n in names], width=0.35, label="p99")
        ax.set_xticks(xs, names)
        ax.set_ylabel("latency of one request, ms")
        ax.legend()

    return plot("gateway_dynamo", bars, out)


if __name__ == "__main__":
    main()

"""`python -m bench.flavor_cycle`: one update cycle through the controller, per flavor.

The same tiny Llama (`rlcp.harness.tiny_model`) behind each flavor, two workers per fleet, each
fleet driven by its own in-process controller: `POST /v1/rl/update_weights` from disk,
pause `keep`, verify on, alternating between two weight sets so every cycle really
reloads. Figures are the medians of `--repeats` cycles, the flavors interleaved cycle by
cycle so that load from others on the machine hits them alike, and reported as ratios to
the `agent` flavor measured in the same run.

- `agent`: `python -m rlcp.agent` on a vLLM CPU engine (one admin call per step, readiness
  gated on the desired version);
- `vllm`: stock `vllm serve` in dev mode (`rlcp.harness.servers.VllmServeProcess`): status from
  five reads, the disk update composed of three calls;
- `dynamo`: two workers of Dynamo 1.6.1's own software (`python -m dynamo.vllm`, Dynamo's own
  worker entry, on a vLLM CPU engine: `rlcp.harness.dynamo.DynamoVllmProcess`), as static specs
  with flavor dynamo (their system ports): status from three reads, a reload refused unless
  paused first.

`smg` is not a flavor but a baseline: SMG 1.13 (`rlcp.harness.smg`, `--enable-rl`) in front of the
`vllm` fleet's two servers, the same update driven through its fan-out by hand (`smg_cycle`),
interleaved with the controller's cycles over those servers. Its rows: `smg` is its bare fan-out
(pause, reload, version, prefix-cache reset, resume: five relayed calls); `smg+verify` adds what
verification SMG allows at all, two more relayed reads (each worker's `weight_info` and
`weight_checker` checksums) compared here, in the bench: SMG tracks no version and compares
nothing itself. Asking for `smg` brings the `vllm` fleet up with it; without smg installed the
rows are skipped with a message saying how to install it.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bench.common import median, quiet_logs, table, write_json
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.settings.reconcile import ReconcileSettings
from rlcp.core.wire.agent.checksums import EMPTY_TENSOR_SHA256
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings, update_body
from rlcp.harness.processes import AgentProcess, ChildProcess, stop_all
from rlcp.harness.servers import VllmServeProcess
from rlcp.harness.smg import SMG_VERSION, SmgMissing, SmgProcess, fanout, smg_home
from rlcp.harness.tiny_model import agent_engine

AGENT_TOKEN = "bench-agent-token"
# The controller's default status poll, read from the field's declaration: a settings object
# (`ControllerSettings()`) would take RLCP_RECONCILE__POLL_INTERVAL_S from the caller's
# environment, and a run's figures would change with a variable nobody passed to the bench.
POLL_INTERVAL_S = float(ReconcileSettings.model_fields["poll_interval_s"].default)
# A fleet: (worker specs for the controller, the processes behind them, the workers' admin token).
Fleet = tuple[list[dict[str, Any]], Sequence[ChildProcess], str]


def agent_fleet(models: dict[str, Path], workdir: Path) -> Fleet:
    def config(i: int) -> dict[str, Any]:
        return {
            "agent_id": f"agent-{i}",
            "allowed_roots": [str(models["base"].parent)],
            "log_format": "json",
            "log_level": "warning",
            "engine": agent_engine(models["base"]),
        }

    procs = [
        AgentProcess(config(i), workdir / f"agent-{i}", name=f"agent-{i}", token=AGENT_TOKEN, start_timeout_s=300)
        for i in range(2)
    ]
    specs = [
        {"id": f"agent-{i}", "admin_url": p.admin_url, "inference_url": p.inference_url, "flavor": "agent"}
        for i, p in enumerate(_start(procs))
    ]
    return specs, procs, AGENT_TOKEN


def vllm_fleet(models: dict[str, Path], workdir: Path) -> Fleet:
    procs = [VllmServeProcess(models["base"], workdir / f"vllm-{i}", name=f"vllm-{i}", core=i) for i in range(2)]
    return [p.spec(f"vllm-{i}") for i, p in enumerate(_start(procs))], procs, "unused-by-stock-vllm"


def dynamo_fleet(models: dict[str, Path], workdir: Path) -> Fleet:
    from rlcp.harness.dynamo import DynamoVllmProcess, dynamo_target

    target, kv = dynamo_target(), workdir / "kv"
    kv.mkdir(parents=True, exist_ok=True)
    procs = [
        DynamoVllmProcess(models["base"], workdir / f"dynamo-{i}", target=target, kv_dir=kv, name=f"dynamo-{i}", core=i)
        for i in range(2)
    ]
    specs = [{"id": f"dynamo-{i}", "admin_url": p.url, "flavor": "dynamo"} for i, p in enumerate(_start(procs))]
    return specs, procs, "unused-by-dynamo"


# flavor -> a function starting its fleet; None: not wired yet.
FLEETS: dict[str, Callable[[dict[str, Path], Path], Fleet] | None] = {
    "agent": agent_fleet,
    "vllm": vllm_fleet,
    "dynamo": dynamo_fleet,
}


def _start(procs: list[Any]) -> list[Any]:
    for p in procs:
        p.spawn()
    for p in procs:
        p.wait_ready()
    return procs


async def cycle(client: TestClient[web.Request, web.Application], models: dict[str, Path], n: int) -> float:
    """One update transaction; returns its wall time in seconds."""
    path, version = _weights(models, n)
    t0 = time.perf_counter()
    resp = await client.post(
        "/v1/rl/update_weights", headers=AUTH, json=update_body(version, path, pause_mode="keep", verify=True)
    )
    body = await resp.json()
    elapsed = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"update cycle {n} answered {resp.status}: {body}")
    return elapsed


def _weights(models: dict[str, Path], n: int) -> tuple[Path, str]:
    """Cycle `n`'s weights and version label: two sets taken in turn, so each cycle changes them."""
    return models[f"weights-{2 if n % 2 == 0 else 1}"], f"cycle-{n}"


async def smg_cycle(
    http: aiohttp.ClientSession, smg_url: str, models: dict[str, Path], n: int, *, verify: bool, workers: int
) -> float:
    """The controller's cycle `n` again, by hand through SMG's fan-out to the same servers (what a
    trainer does with SMG: one relayed call per step, every worker's answer checked); returns its
    wall time. The calls are the `vllm` driver's (`workers/flavors/vllm.py`). Cycle `n` reloads the
    weights and label the controller's cycle `n` just set: vLLM's `reload_weights` reads the files
    again whatever they are, and the servers stay in the state the controller wants (see `run`)."""
    path, version = _weights(models, n)
    steps: list[tuple[str, str, dict[str, Any] | None, dict[str, str] | None]] = [
        ("POST", "pause", None, {"mode": "keep"}),
        ("POST", "collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}, None),
        ("POST", "update_weight_version", {"new_version": version}, None),
        ("POST", "reset_prefix_cache", None, {"reset_running_requests": "true"}),
    ]
    t0 = time.perf_counter()
    for method, route, body, params in steps:
        await fanout(http, smg_url, route, body, method=method, params=params, expect=workers)
    if verify:
        infos = await fanout(http, smg_url, "weight_info", method="GET", expect=workers)
        sums = await fanout(http, smg_url, "weight_checker", {"action": "checksum"}, expect=workers)
        _agree(infos, sums, version)
    await fanout(http, smg_url, "resume", expect=workers)
    return time.perf_counter() - t0


def _agree(infos: dict[str, Any], sums: dict[str, Any], version: str) -> None:
    """What the controller's verify checks, done on the answers SMG relayed: every worker reports
    `version`, and their checksums agree (tensors hashed from no bytes left out, as verify.py does)."""
    versions = {w: (b or {}).get("weight_version") for w, b in infos.items()}
    if set(versions.values()) != {version}:
        raise RuntimeError(f"SMG cycle: workers report versions {versions}, expected {version!r}")
    compared = [
        {k: v for k, v in ((b or {}).get("checksums") or {}).items() if v != EMPTY_TENSOR_SHA256} for b in sums.values()
    ]
    if not compared[0] or any(c != compared[0] for c in compared[1:]):
        raise RuntimeError(f"SMG cycle: the workers' checksums disagree or are empty ({len(compared[0])} tensors)")


async def run(flavors: list[str], repeats: int, workdir: Path, *, poll_interval_s: float) -> dict[str, Any]:
    from rlcp.harness.tiny_model import make_model_family

    flavors, with_smg = _with_smg(flavors)
    models = make_model_family(workdir / "models")
    fleets: dict[str, Fleet] = {}
    clients: dict[str, TestClient[web.Request, web.Application]] = {}
    smg: SmgProcess | None = None
    http = aiohttp.ClientSession()
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
                workdir / f"ctl-{flavor}",
                specs,
                allowed_roots=[str(models["base"].parent)],
                log_level="error",
                workers={"token": token, "timeout_s": 30, "pause_timeout_s": 60, "weight_load_timeout_s": 120},
                reconcile={
                    "poll_interval_s": poll_interval_s,
                    "interval_s": 0.1,
                    "backoff_initial_s": 0.5,
                    "backoff_max_s": 5,
                },
            )
            clients[flavor] = TestClient(TestServer(assemble(settings, token=CTL_TOKEN)))
            await clients[flavor].start_server()
        servers = [spec["admin_url"] for spec in fleets["vllm"][0]] if with_smg and "vllm" in fleets else []
        if servers:
            smg = SmgProcess(servers, workdir / "smg")
            smg.spawn()
            await asyncio.to_thread(smg.wait_ready)
            print(f"flavor_cycle: SMG {SMG_VERSION} up at {smg.url}, fanning out to {servers}")
        rows = [*clients, *(row for row, _ in SMG_ROWS if smg is not None)]
        times: dict[str, list[float]] = {row: [] for row in rows}
        for n in range(repeats + 1):  # the first round warms every fleet up
            for flavor, client in clients.items():
                elapsed = await cycle(client, models, n)
                if n:
                    times[flavor].append(elapsed)
                if flavor == "vllm" and smg is not None:
                    for row, elapsed in (await _smg_round(client, http, smg.url, models, n, len(servers))).items():
                        if n:
                            times[row].append(elapsed)
        return {f: {"median_s": median(t), "min_s": min(t), "max_s": max(t), "cycles_s": t} for f, t in times.items()}
    finally:
        await http.close()
        for client in clients.values():
            await client.close()
        stop_all([p for _, procs, _ in fleets.values() for p in procs] + ([smg] if smg is not None else []))


# SMG's rows: (name, verify).
SMG_ROWS = (("smg", False), ("smg+verify", True))


def _with_smg(flavors: list[str]) -> tuple[list[str], bool]:
    """The fleets to start and whether SMG's rows run: SMG fronts the `vllm` fleet's servers, so
    asking for it brings that fleet up; without smg installed its rows are skipped, saying why."""
    if "smg" not in flavors:
        return flavors, False
    flavors = [f for f in flavors if f != "smg"]
    try:
        smg_home()
    except SmgMissing as exc:
        print(f"flavor_cycle: the smg rows are skipped: {exc}")
        return flavors, False
    if "vllm" not in flavors:
        print("flavor_cycle: smg fans out to the vllm fleet's servers: starting that fleet too")
        flavors.append("vllm")
    return flavors, True


async def _smg_round(
    client: TestClient[web.Request, web.Application],
    http: aiohttp.ClientSession,
    smg_url: str,
    models: dict[str, Path],
    n: int,
    workers: int,
) -> dict[str, float]:
    """SMG's cycles of round `n`, right after the controller's over the same servers. That
    controller's reconciler would resume a worker SMG paused (its desired state says running), so
    SMG's cycles run holding the controller's operation gate, as any API operation of its own
    does: the reconciler stands aside and its status reads go on, as they do during its own cycles.
    Waiting for the gate is not timed. The two rows take turns going first."""
    assert client.app is not None
    rows = SMG_ROWS if n % 2 == 0 else SMG_ROWS[::-1]
    async with client.app[CONTROLLER].gate.api_operation("smg-baseline"):
        return {row: await smg_cycle(http, smg_url, models, n, verify=verify, workers=workers) for row, verify in rows}


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--flavors",
        default="agent,vllm,dynamo",
        help="comma-separated, of agent, vllm, dynamo and smg (SMG 1.13's fan-out over the vllm "
        "fleet's servers); the ratio column is against agent when it runs, else the first",
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--poll-interval-s",
        type=float,
        default=POLL_INTERVAL_S,
        help="how often the controller reads every member's status (default: the controller's, "
        f"{POLL_INTERVAL_S:g} s); those reads reach the same servers during the cycles, SMG's too",
    )
    args = parser.parse_args(argv)
    args.flavors = [f.strip() for f in args.flavors.split(",") if f.strip()]
    unknown = sorted(set(args.flavors) - set(FLEETS) - {"smg"})
    if unknown or not args.flavors:
        parser.error(f"--flavors: unknown {unknown}; known: {', '.join([*FLEETS, 'smg'])}")
    return args


def main() -> None:
    args = arguments()
    flavors: list[str] = args.flavors
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="flavor-cycle-") as tmp:
        figures = asyncio.run(run(flavors, args.repeats, Path(tmp), poll_interval_s=args.poll_interval_s))
    if not figures:
        raise SystemExit("flavor_cycle: nothing was measured (see above)")
    base = "agent" if "agent" in figures else next(iter(figures))
    rows = [
        (f, fig["median_s"] * 1e3, fig["min_s"] * 1e3, fig["max_s"] * 1e3, fig["median_s"] / figures[base]["median_s"])
        for f, fig in figures.items()
    ]
    print(table(["flavor", "median ms", "min ms", "max ms", f"x {base}"], rows))
    ratios = {row: _over(figures["vllm"], figures[row]) for row, _ in SMG_ROWS if row in figures and "vllm" in figures}
    for row, ratio in ratios.items():
        print(
            f"the controller's cycle over stock vLLM (verify on) / SMG's {row}, same servers: "
            f"x{ratio['of_medians']:.2f} (ratio of medians), x{ratio['paired']:.2f} (median of the rounds' ratios)"
        )
    print(
        "written to",
        write_json(
            "flavor_cycle",
            {
                "repeats": args.repeats,
                "poll_interval_s": args.poll_interval_s,
                "figures": figures,
                "vllm_over_smg": ratios,
            },
        ),
    )


def _over(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """Our cycle over theirs two ways: the ratio of the medians, and the median of each round's
    ratio (the two cycles of a round ran back to back, so a load swing between rounds, which the
    shared machine has plenty of, hits both sides of a pair alike)."""
    pairs = [a / b for a, b in zip(ours["cycles_s"], theirs["cycles_s"], strict=True)]
    return {"of_medians": ours["median_s"] / theirs["median_s"], "paired": median(pairs)}


if __name__ == "__main__":
    main()

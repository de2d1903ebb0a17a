"""`python -m bench.disk_update`: a disk weight update of a ~100M-parameter model on a real
vLLM CPU engine, through the controller, against a raw safetensors load of the same files.

- controller: `POST /v1/rl/update_weights` (pause keep, update, verify with weight
  checksums, resume) on the real controller with one member, a real agent process
  (`python -m rlcp.agent`) on a real vLLM CPU engine. Versions alternate between two
  weight directories, so every cycle really loads different bytes.
- baseline (same run, interleaved): the same safetensors files read with
  `safetensors.torch.load_file` and copied into a same-shaped `LlamaForCausalLM`
  (`load_state_dict`) in this process: the least any loader must do (read every byte,
  write every parameter). vLLM's own reload (`collective_rpc("reload_weights")`, what
  the agent runs) does that plus its weight processing; its time inside the agent is
  reported too (the agent's operation record), as are the checksums of the verify step
  (`POST /weight_checker`, timed on its own).
- controller, verify off: the same cycle with `verify: false` (pause, update, resume), so
  what verification costs is visible.
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
from bench.vllm_agent import MODEL_100M, VOCAB_100M, agent_config, start_agent
from rlcp.harness.checkpoints import make_models


def raw_load_factory(model_dir: Path) -> Any:
    """A same-shaped HF model, and a function loading a weights dir into it; returns its time."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").float()

    def load(weights_dir: Path) -> float:
        t0 = time.perf_counter()
        for f in sorted(weights_dir.glob("*.safetensors")):
            model.load_state_dict(load_file(str(f)), strict=False)
        return time.perf_counter() - t0

    return load


async def run(a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from bench.fanout import ControllerUnderTest
    from rlcp.harness.simfleet import HostedAgent

    shape = None if a.tiny else MODEL_100M
    t0 = time.perf_counter()
    models = make_models(workdir / "models", shape=shape, vocab_size=None if a.tiny else VOCAB_100M, seeds=(1, 2))
    nbytes = sum(f.stat().st_size for f in models["weights-1"].glob("*.safetensors"))
    print(
        f"bench.disk_update: model made in {time.perf_counter() - t0:.0f}s ({nbytes / 1e6:.0f} MB); starting the agent",
        flush=True,
    )
    agent = start_agent(agent_config(models["base"], [workdir]), workdir / "agent")
    raw_load = raw_load_factory(models["base"])
    try:
        members = [HostedAgent("bench-vllm", agent.admin_url)]
        async with (
            ControllerUnderTest(members, workdir, 64, worker_token=agent.token) as ctl,
            aiohttp.ClientSession(headers=agent.auth) as s,
        ):
            rows: dict[str, list[float]] = {
                "controller_s": [],
                "controller_noverify_s": [],
                "raw_load_s": [],
                "agent_reload_s": [],
                "checksum_s": [],
            }
            dirs = [models["weights-1"], models["weights-2"]]
            for i in range(a.repeats + 1):  # the first round warms up (page cache, first-call costs)
                path = dirs[i % 2]
                cycle = await update_cycle(ctl, f"v{i}", path, verify=True)
                async with s.get(agent.admin_url + "/v1/agent/state") as resp:
                    state = await resp.json()
                reload = next(
                    op["duration_s"] for op in state["last_operations"] if op["kind"] == "update_weights_from_disk"
                )
                t = time.perf_counter()
                async with s.post(agent.admin_url + "/weight_checker", json={"action": "checksum"}) as resp:
                    checksums = await resp.json()
                    assert resp.status == 200, checksums
                checksum = time.perf_counter() - t
                await asyncio.to_thread(check_loaded, checksums["checksums"], path)
                empty = sorted(k for k, v in checksums["checksums"].items() if v == EMPTY_SHA256)
                # The other directory, so this cycle too loads different bytes.
                noverify = await update_cycle(ctl, f"u{i}", dirs[(i + 1) % 2], verify=False)
                raw = await asyncio.to_thread(raw_load, path)
                if i > 0:
                    for key, v in (
                        ("controller_s", cycle),
                        ("controller_noverify_s", noverify),
                        ("raw_load_s", raw),
                        ("agent_reload_s", reload),
                        ("checksum_s", checksum),
                    ):
                        rows[key].append(v)
                print(
                    f"  round {i}: controller {cycle:.3f}s (agent reload {reload:.3f}s, checksums "
                    f"{checksum:.3f}s), verify off {noverify:.3f}s, raw load {raw:.3f}s",
                    flush=True,
                )
    finally:
        agent.stop()
    med = {k: median(v) for k, v in rows.items()}
    return {
        "bytes": nbytes,
        "parameters": nbytes // 4,
        "params": {"repeats": a.repeats, "tiny": a.tiny},
        # vLLM's CPU backend empties its linear layers' parameters (the weights live in oneDNN):
        # their checksums are sha256(b"") and cover nothing.
        "checksums": {"tensors": len(checksums["checksums"]), "empty_tensors": len(empty), "empty_examples": empty[:3]},
        "times_s": rows,
        "median_s": med,
        "ratio_controller_vs_raw": med["controller_s"] / med["raw_load_s"],
        "ratio_controller_noverify_vs_raw": med["controller_noverify_s"] / med["raw_load_s"],
        "ratio_agent_reload_vs_raw": med["agent_reload_s"] / med["raw_load_s"],
    }


EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def check_loaded(checksums: dict[str, str], weights_dir: Path, name: str = "lm_head.weight") -> None:
    """The engine holds the bytes of `weights_dir`: its checksum of one tensor (vLLM's sha256 of
    the tensor's bytes) equals ours of the same tensor in the file. `lm_head`, because vLLM's
    CPU backend keeps it as loaded (its linear layers' weights go into oneDNN and the parameters
    are left empty), with its vocabulary padded with zeros to a multiple of 64."""
    import hashlib

    import torch
    from safetensors import safe_open

    for f in weights_dir.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            if name in st.keys():
                tensor = st.get_tensor(name)
                break
    else:
        raise RuntimeError(f"no {name} in {weights_dir}")
    tensor = torch.nn.functional.pad(tensor, (0, 0, 0, -tensor.shape[0] % 64))
    want = hashlib.sha256(tensor.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
    got = [v for k, v in checksums.items() if k.endswith(":" + name) or k == name]
    if got != [want]:
        raise RuntimeError(f"the engine's {name} is not the one in {weights_dir}")


async def update_cycle(ctl: Any, version: str, path: Path, *, verify: bool) -> float:
    """One `POST /v1/rl/update_weights` (pause keep); its wall time. Raises unless it succeeded
    (and, with verify on, the controller marked the fleet verified)."""
    body = {"version": version, "source": {"kind": "disk", "path": str(path)}, "pause_mode": "keep", "verify": verify}
    t = time.perf_counter()
    async with ctl.session.post(ctl.url + "/v1/rl/update_weights", json=body) as resp:
        answer = await resp.json()
    elapsed = time.perf_counter() - t
    if resp.status != 200 or answer.get("status") != "ok":
        raise RuntimeError(f"update_weights({version}) answered {resp.status}: {str(answer)[:400]}")
    async with ctl.session.get(ctl.url + "/v1/rl/state") as resp:
        applied = (await resp.json())["applied"]
    if verify and not applied["verified"]:
        raise RuntimeError(f"update_weights({version}) succeeded but the fleet is not verified")
    return elapsed


def render(r: dict[str, Any]) -> str:
    m = r["median_s"]
    return table(
        ["what", "median s", "÷ raw load"],
        [
            ["raw safetensors load + load_state_dict (baseline)", m["raw_load_s"], 1.0],
            [
                "agent: vLLM reload_weights + version + prefix cache",
                m["agent_reload_s"],
                r["ratio_agent_reload_vs_raw"],
            ],
            ["agent: weight checksums (verify)", m["checksum_s"], m["checksum_s"] / m["raw_load_s"]],
            ["controller update_weights cycle (verify on)", m["controller_s"], r["ratio_controller_vs_raw"]],
            [
                "controller update_weights cycle (verify off)",
                m.get("controller_noverify_s"),
                r.get("ratio_controller_noverify_vs_raw"),
            ],
        ],
    )


def draw(r: dict[str, Any], out_dir: Path) -> Path:
    def d(ax: Any) -> None:
        m = r["median_s"]
        labels = ["raw load", "vLLM reload\n(in agent)", "checksums", "controller\nverify off", "controller\nverify on"]
        ax.bar(
            labels,
            [
                m["raw_load_s"],
                m["agent_reload_s"],
                m["checksum_s"],
                m.get("controller_noverify_s", 0),
                m["controller_s"],
            ],
            color=["grey", "C0", "C1", "C2", "C2"],
        )
        ax.axhline(m["raw_load_s"] * 1.3, color="grey", ls=":", label="target: 1.3 × raw load")
        ax.legend(fontsize=8)
        ax.set_ylabel("seconds (median)")
        ax.set_title(f"Disk update, {r['parameters'] / 1e6:.0f}M params ({r['bytes'] / 1e6:.0f} MB), vLLM CPU")

    return plot("disk_update", d, out_dir)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="the tests' tiny Llama instead of ~100M parameters")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="bench-disk-") as tmp:
        result = asyncio.run(run(a, Path(tmp)))
    return report("disk_update", result, a.out, text=render(result), draw=lambda out: draw(result, out))


if __name__ == "__main__":
    main()

"""SGLang 0.5.23's own server (`python -m sglang.launch_server`) over the tiny model, on the CPU.

Nothing of SGLang's is rebuilt or patched: its server runs from its own venv (scripts/setup-sglang.sh,
built once per machine), with that script's `extra` dir on PYTHONPATH for SGLang's processes only (the
vllm package SGLang's CPU rotary embedding imports, an import-only torchvision stand-in, and a
sitecustomize dropping `pin_memory` for LoRA). Facts: ../shared/TESTING.md, "SGLang 0.5.23".

`SglangServerProcess(model, workdir, venv=sglang_venv()).start()` serves the model as `SERVED_NAME` at
`.url`. The port is picked once, so `kill` then `start` brings the same server back on the same address,
as a restarted pod behind the same Service would be.

`run_sglang_trainer(spec, log, venv=...)` runs a trainer on SGLang's side of the broadcast wire
(`python -m rlcp.harness.sglang SPEC_JSON` in SGLang's venv): rank 0 of a group made by SGLang's own
`init_custom_process_group` (slime's trainer makes its group with a copy of it), driving the fleet
through the controller's weight-transfer API.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlcp.harness.processes import REPO, ProcessError, child_env
from rlcp.harness.servers import HttpServerProcess
from rlcp.harness.tiny_model import MAX_POSITIONS, SERVED_NAME

SGLANG_VERSION = "0.5.23"

# Without --max-total-tokens SGLang sizes its KV pool from host memory (~15 GB here); 8192 tokens are
# plenty for the tests' batches. The LoRA flags: the torch-native backend (no CUDA kernels), two
# adapters loaded at once, rank 8 on q/v as `make_lora` writes them. --sleep-on-idle: SGLang's
# scheduler otherwise polls its sockets without a pause, a whole core while no request runs (~0.65
# of a core through the SGLang module of a full run, on a machine with two); it then waits on them.
SERVE_FLAGS = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--context-length",
    str(MAX_POSITIONS),
    "--max-total-tokens",
    "8192",
    "--max-running-requests",
    "8",
    "--skip-server-warmup",
    "--sleep-on-idle",
    "--served-model-name",
    SERVED_NAME,
]
LORA_FLAGS = [
    "--enable-lora",
    "--max-lora-rank",
    "8",
    "--lora-target-modules",
    "q_proj",
    "v_proj",
    "--lora-backend",
    "torch_native",
    "--max-loaded-loras",
    "2",
    "--max-loras-per-batch",
    "2",
]


def sglang_venv() -> Path:
    """SGLang's venv; runs scripts/setup-sglang.sh (a no-op once built) for it."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup-sglang.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env=child_env(RLCP_PYTHON=sys.executable),
    )
    if out.returncode != 0:
        raise ProcessError(f"scripts/setup-sglang.sh failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


class SglangServerProcess(HttpServerProcess):
    """One SGLang server over `model`; `lora`: adapters on. `core` pins its threads to one core
    (`taskset`) so it and a vLLM engine on this 2-core machine do not share one. Ready when
    `/health_generate` answers 200: its scheduler has run a generation, not only its HTTP server is up
    (a probe that generates: a longer deadline on a loaded machine)."""

    ready_path = "/health_generate"
    ready_timeout_s = 10.0

    def __init__(
        self,
        model: Path,
        workdir: Path,
        *,
        venv: Path,
        name: str = "sglang",
        lora: bool = True,
        core: int | None = None,
        port: int | None = None,
        start_timeout_s: float = 240.0,
        **kw: Any,
    ) -> None:
        from rlcp.harness.http import free_port

        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.model, self.venv, self.lora, self.core = model, venv, lora, core
        self.port = port or free_port()

    def argv(self) -> list[str]:
        pinned = ["taskset", "-c", str(self.core)] if self.core is not None else []
        return [
            *pinned,
            str(self.venv / "bin" / "python"),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(self.model),
            *self.listen_args(),
            *SERVE_FLAGS,
            *(LORA_FLAGS if self.lora else []),
        ]

    def environment(self) -> dict[str, str]:
        # The project's PYTHONPATH must not leak in (its packages are built for another torch).
        # GLOO_SOCKET_IFNAME: SGLang's broadcast group is gloo on the CPU, kept on loopback.
        env = child_env(
            PYTHONPATH=str(self.venv / "extra"),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            # The linked vllm package has no dist-info: without this, vLLM does not know it is its
            # CPU build and loads its AVX-512 kernels, an illegal instruction on an AVX2-only CPU.
            VLLM_TARGET_DEVICE="cpu",
            **self.extra_env,
        )
        env.pop("VIRTUAL_ENV", None)
        return env


# -- a trainer on SGLang's broadcast wire ----------------------------------------------------------
TRAINER_S = 300.0  # imports torch and SGLang's utilities on a busy 2-core machine, then broadcasts


def trainer_main() -> None:
    """Rank 0 of SGLang's kind of weight-update group, the calls through the controller: init (the
    group formed beside the call), start, one chunk naming every tensor of `model_dir` (each then
    broadcast alone, in that order, in its dtype, as SGLang receives them), finish with `version`.
    `spec["corrupt"]`: the last tensor declared and sent one element short, which SGLang receives
    and then fails to load (a failed broadcast). Exits 0 only if every call answered 200."""
    import threading
    from datetime import timedelta

    import requests
    import torch
    from safetensors import safe_open
    from sglang.srt.utils.common import init_custom_process_group

    spec = json.loads(sys.argv[1])
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {spec['token']}"
    base = spec["url"] + "/v1/rl/weight_transfer"
    failures: list[str] = []

    def call(route: str, body: dict[str, Any]) -> None:
        resp = http.post(f"{base}/{route}", json=body, timeout=240)
        print(f"trainer: {route} -> {resp.status_code} {resp.text[:2000]}", flush=True)
        if resp.status_code != 200:
            failures.append(route)

    def beside(route: str, body: dict[str, Any]) -> threading.Thread:
        # The workers block in the call until rank 0 joins or broadcasts: run it beside this side.
        thread = threading.Thread(target=call, args=(route, body), daemon=True)
        thread.start()
        return thread

    world_size = int(http.get(base, timeout=30).json()["trainer_world_size"])
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(spec["model_dir"]).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            tensors |= {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    if spec.get("corrupt"):
        last = sorted(tensors)[-1]
        tensors[last] = tensors[last].reshape(-1)[:-1].clone()
    group = spec.get("group_name", "weight_update_group")
    init = beside(
        "init",
        {
            "init_info": {
                "master_address": "127.0.0.1",
                "master_port": spec["port"],
                "world_size": world_size,
                "backend": "gloo",
                "group_name": group,
            }
        },
    )
    pg = init_custom_process_group(
        backend="gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        world_size=world_size,
        rank=0,
        group_name=group,
        timeout=timedelta(seconds=120),  # torch's default is 30 minutes
    )
    init.join()
    if failures:
        raise SystemExit(f"trainer: {failures} failed")
    call("start", {})
    names = sorted(tensors)
    chunk = {
        "names": names,
        "dtype_names": [str(tensors[n].dtype).removeprefix("torch.") for n in names],
        "shapes": [list(tensors[n].shape) for n in names],
    }
    update = beside("update", {"update_info": chunk})
    for name in names:
        torch.distributed.broadcast(tensors[name], src=0, group=pg)
    update.join()
    call("finish", {"weight_version": spec["version"]})
    torch.distributed.destroy_process_group(pg)  # this side only: the fleet leaves on the controller's shutdown
    if failures:
        raise SystemExit(f"trainer: {failures} failed")
    print("trainer: sent", spec["version"], "to a group of", world_size, flush=True)


async def run_sglang_trainer(spec: dict[str, Any], log: Path, *, venv: Path) -> int:
    """Run the trainer in SGLang's venv to its end (killed after `TRAINER_S`); its exit code."""
    env = child_env(
        PYTHONPATH=f"{REPO}:{venv / 'extra'}", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", VLLM_TARGET_DEVICE="cpu"
    )
    env.pop("VIRTUAL_ENV", None)
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "python"),
            "-m",
            "rlcp.harness.sglang",
            json.dumps(spec),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        return await asyncio.wait_for(proc.wait(), TRAINER_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


if __name__ == "__main__":
    trainer_main()

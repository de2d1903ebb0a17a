"""SGLang 0.5.23's own server (`python -m sglang.launch_server`) over the tiny model, on the CPU.

Nothing of SGLang's is rebuilt or patched: its server runs from its own venv (scripts/setup-sglang.sh,
built once per machine), with that script's `extra` dir on PYTHONPATH for SGLang's processes only (the
vllm package SGLang's CPU rotary embedding imports, an import-only torchvision stand-in, and a
sitecustomize dropping `pin_memory` for LoRA). Facts: ../shared/TESTING.md, "SGLang 0.5.23".

`SglangServerProcess(model, workdir, venv=sglang_venv()).start()` serves the model as `SERVED_NAME` at
`.url`. The port is picked once, so `kill` then `start` brings the same server back on the same address,
as a restarted pod behind the same Service would be.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from rlcp.harness.processes import REPO, HttpServerProcess, ProcessError, child_env
from rlcp.harness.tiny_model import MAX_POSITIONS, SERVED_NAME

SGLANG_VERSION = "0.5.23"

# Without --max-total-tokens SGLang sizes its KV pool from host memory (~15 GB here); 8192 tokens are
# plenty for the tests' batches. The LoRA flags: the torch-native backend (no CUDA kernels), two
# adapters loaded at once, rank 8 on q/v as `make_lora` writes them.
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
            PYTHONPATH=str(self.venv / "extra"), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **self.extra_env
        )
        env.pop("VIRTUAL_ENV", None)
        return env

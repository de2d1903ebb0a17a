"""The trainer process of the broadcast tests: `python -m rlcp.harness.trainer SPEC_JSON`.

It loads a Llama with transformers and broadcasts every parameter as rank 0 through vLLM's
own trainer-side engine (`WeightTransferTrainerFactory.trainer_init` + `send_weights`) on
this project's gloo backend. Its client is the controller's (`spec["client"] ==
"controller"`) or vLLM's own `HTTPVLLMWeightSyncClient`, unchanged, with the token from
~/.netrc (NETRC). `run_trainer` runs it with a deadline and fails with its log's tail.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlcp.harness.processes import REPO

TRAINER_S = 300.0  # imports torch, transformers and vLLM on a busy 2-core machine, then broadcasts


def main() -> None:
    import torch
    from transformers import LlamaForCausalLM
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from rlcp.agent.weight_transfer.cpu_gloo import GlooTrainerInitInfo, register

    spec = json.loads(sys.argv[1])
    register()  # a trainer process runs no vLLM plugins
    model = LlamaForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    if spec["client"] == "controller":
        from rlcp.client.client import ControllerWeightSyncClient

        client = ControllerWeightSyncClient(spec["url"], token=spec["token"], timeout_s=240)
        world_size = client.trainer_world_size()
    else:  # vLLM's own HTTP client, unchanged; the token comes from ~/.netrc (NETRC)
        import requests
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

        client = HTTPVLLMWeightSyncClient(spec["url"], timeout=240)
        world_size = 1 + requests.get(spec["url"] + "/get_world_size", timeout=30).json()["world_size"]
    init_info = GlooTrainerInitInfo(
        master_address="127.0.0.1", master_port=spec["port"], world_size=world_size, timeout_s=120.0, rank=0
    )
    engine = WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=ModuleSource(model))
    engine.send_weights(weight_version=spec["version"])
    engine.shutdown()
    print("trainer: sent", spec["version"], "to a group of", world_size, flush=True)


async def run_trainer(spec: dict[str, Any], log: Path, env: dict[str, str] | None = None) -> None:
    """Run the trainer to its end (at most `TRAINER_S`); assert it exited 0."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlcp.harness.trainer", json.dumps(spec)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        )
    try:
        deadline = time.monotonic() + TRAINER_S
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, f"trainer exited with {proc.returncode}:\n{log.read_text()[-4000:]}"


if __name__ == "__main__":
    main()

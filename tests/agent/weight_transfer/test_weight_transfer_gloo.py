"""The broadcast weight-transfer path end to end on CPU: trainer → gloo → a real vLLM engine.

The session's vLLM agent runs a real CPU engine with `weight_transfer_config={"backend": "gloo"}`
(the backend registered by this project's `vllm.general_plugins` entry point). A trainer
runs in its own process, loads a Llama from safetensors with transformers and
broadcasts every parameter as rank 0 through `GlooTrainerWeightTransferEngine`.

Greedy completions are exact functions of the weights, so "the engine holds the
broadcast weights" is checked against the same weights loaded from disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from rlcp.harness.http import call, free_port
from rlcp.harness.processes import REPO, AgentProcess

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PROMPT = "Weights move from the trainer to every engine in the fleet."
TRAINER_START_S = 180.0  # imports torch, transformers and vLLM on a busy 2-core machine


# -- the trainer process -------------------------------------------------------------------
class _RelayClient:
    """A `VLLMWeightSyncClient` that hands each payload to the test through a file, so the
    test drives the agent's routes itself while this process joins and broadcasts."""

    def __init__(self, relay_dir: Path) -> None:
        self.relay_dir = relay_dir

    def _write(self, name: str, payload: dict) -> None:
        tmp = self.relay_dir / f".{name}"
        tmp.write_text(json.dumps(payload))
        tmp.rename(self.relay_dir / name)  # the test never sees half a file

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._write("init_info.json", init_info)

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: dict) -> None:
        self._write("update_info.json", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        pass


class _AgentClient:
    """A `VLLMWeightSyncClient` over the agent's admin routes (vLLM's own HTTP client sends
    no bearer token)."""

    def __init__(self, admin_url: str, token: str) -> None:
        self.admin_url, self.headers = admin_url, {"Authorization": f"Bearer {token}"}

    def _post(self, path: str, body: dict | None = None) -> None:
        import requests

        resp = requests.post(self.admin_url + path, json=body, headers=self.headers, timeout=300)
        resp.raise_for_status()

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self._post("/start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("/finish_weight_update", {"weight_version": weight_version})


def _trainer_main() -> None:
    """Rank 0: load `model_dir` and broadcast it once. Run as a subprocess (see `_trainer`)."""
    import torch
    from transformers import LlamaForCausalLM
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from rlcp.agent.weight_transfer.cpu_gloo import GlooTrainerInitInfo, GlooWeightTransferUpdateInfo, register

    spec = json.loads(sys.argv[1])
    register()  # a trainer process runs no vLLM plugins
    model = LlamaForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    client = (
        _RelayClient(Path(spec["relay_dir"])) if "relay_dir" in spec else _AgentClient(spec["admin_url"], spec["token"])
    )
    init_info = GlooTrainerInitInfo(
        master_address="127.0.0.1", master_port=spec["port"], world_size=2, timeout_s=120.0, rank=0
    )
    source = ModuleSource(model)
    engine = WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)
    if spec.get("hold_s"):  # a trainer that joins, announces a chunk, and never sends it
        client.update_weights(asdict(GlooWeightTransferUpdateInfo.from_metadata(source.metadata())))
        time.sleep(spec["hold_s"])
    else:
        engine.send_weights(weight_version=spec.get("version"))
    engine.shutdown()


def _trainer(spec: dict, log: Path) -> subprocess.Popen:
    code = f"from {__name__} import _trainer_main; _trainer_main()"  # wherever this module moves
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(spec)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )


async def _wait_exit(proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == 0, f"trainer exited with {proc.returncode}:\n{log.read_text()[-4000:]}"


async def _wait_file(path: Path, proc: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + TRAINER_START_S
    while not path.exists():
        assert proc.poll() is None, f"trainer exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {path.name} from the trainer in {TRAINER_START_S}s"
        await asyncio.sleep(0.1)
    return json.loads(path.read_text())


# -- fixtures and helpers -------------------------------------------------------------------
async def _admin(http, agent: AgentProcess, path: str, body: dict | None = None, timeout_s: float = 120.0):
    return await call(http, "POST", agent.admin_url + path, body=body, headers=agent.auth, timeout_s=timeout_s)


async def _complete(http, agent: AgentProcess) -> list[int]:
    status, body = await call(
        http,
        "POST",
        agent.inference_url + "/v1/completions",
        body={
            "model": "tiny",
            "prompt": PROMPT,
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, body
    return body["choices"][0]["token_ids"]


async def _load_from_disk(http, agent: AgentProcess, path: Path, version: str) -> list[int]:
    status, body = await _admin(http, agent, "/v1/agent/weights/disk", {"path": str(path), "version": version})
    assert status == 200, body
    return await _complete(http, agent)


@pytest.fixture
async def disk_refs(http, vllm_agent, tiny_models, references) -> dict[str, list[int]]:
    """Greedy tokens of weights-1 and weights-2 loaded from disk; leaves the agent on weights-1."""
    if not references:
        references["weights-2"] = await _load_from_disk(http, vllm_agent, tiny_models["weights-2"], "disk-2")
        references["weights-1"] = await _load_from_disk(http, vllm_agent, tiny_models["weights-1"], "disk-1")
        assert references["weights-1"] != references["weights-2"]
    else:
        await _load_from_disk(http, vllm_agent, tiny_models["weights-1"], "disk-1")
    return references


async def _weight_version(http, agent: AgentProcess) -> str | None:
    status, body = await call(http, "GET", agent.admin_url + "/weight_info", headers=agent.auth)
    assert status == 200
    return body["weight_version"]


# -- tests -------------------------------------------------------------------------------------
async def test_broadcast_through_the_admin_routes_matches_disk_load(http, vllm_agent, tiny_models, disk_refs, tmp_path):
    """The test drives the four routes; the trainer joins and broadcasts beside them."""
    log = tmp_path / "trainer.log"
    trainer = _trainer(
        {"model_dir": str(tiny_models["weights-2"]), "port": free_port(), "relay_dir": str(tmp_path)}, log
    )
    try:
        init_info = await _wait_file(tmp_path / "init_info.json", trainer, log)
        assert init_info["rank_offset"] == 1 and init_info["world_size"] == 2
        # Returns once the worker and the trainer (already waiting as rank 0) have joined.
        status, body = await _admin(http, vllm_agent, "/init_weight_transfer_engine", {"init_info": init_info})
        assert status == 200, body
        status, body = await _admin(http, vllm_agent, "/start_weight_update")
        assert status == 200, body
        update_info = await _wait_file(tmp_path / "update_info.json", trainer, log)
        assert set(update_info) == {"names", "dtype_names", "shapes"}
        assert "lm_head.weight" in update_info["names"] and set(update_info["dtype_names"]) == {"float32"}
        status, body = await _admin(http, vllm_agent, "/update_weights", {"update_info": update_info})
        assert status == 200, body
        status, body = await _admin(http, vllm_agent, "/finish_weight_update", {"weight_version": "bcast-1"})
        assert status == 200, body
        await _wait_exit(trainer, log, 60)
    finally:
        if trainer.poll() is None:
            trainer.kill()

    assert await _weight_version(http, vllm_agent) == "bcast-1"
    assert await _complete(http, vllm_agent) == disk_refs["weights-2"]


async def test_trainer_engine_drives_the_agent_over_http(http, vllm_agent, tiny_models, disk_refs, tmp_path):
    """vLLM's trainer-side API end to end: trainer_init + send_weights call the agent's
    routes themselves (a second init on the same engine replaces its group)."""
    await _load_from_disk(http, vllm_agent, tiny_models["weights-2"], "disk-2")
    log = tmp_path / "trainer.log"
    trainer = _trainer(
        {
            "model_dir": str(tiny_models["weights-1"]),
            "port": free_port(),
            "admin_url": vllm_agent.admin_url,
            "token": vllm_agent.token,
            "version": "bcast-2",
        },
        log,
    )
    try:
        await _wait_exit(trainer, log, TRAINER_START_S)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert await _weight_version(http, vllm_agent) == "bcast-2"
    assert await _complete(http, vllm_agent) == disk_refs["weights-1"]


@pytest.mark.parametrize("missing", ["no trainer", "one rank of three never joins"])
async def test_init_times_out_when_a_rank_never_joins_and_the_engine_stays_healthy(
    http, vllm_agent, disk_refs, missing
):
    from datetime import timedelta

    from torch.distributed import TCPStore

    port, store = free_port(), None
    init_info = {
        "master_address": "127.0.0.1",
        "master_port": port,
        "rank_offset": 1,
        "world_size": 2,
        "timeout_s": 3.0,
    }
    if missing != "no trainer":
        # The store is up (as a trainer's would be), but rank 2 never comes: the worker
        # joins the store and then waits in the gloo rendezvous until its timeout.
        store = TCPStore(
            "127.0.0.1",
            port,
            world_size=3,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=30),
            use_libuv=False,
        )
        init_info["world_size"] = 3
    t0 = time.monotonic()
    status, body = await _admin(
        http, vllm_agent, "/init_weight_transfer_engine", {"init_info": init_info}, timeout_s=90
    )
    assert status == 502, body
    assert "could not join" in body["error"]["message"]
    assert time.monotonic() - t0 < 60
    del store

    status, _ = await call(http, "GET", vllm_agent.admin_url + "/healthz")
    assert status == 200
    assert await _complete(http, vllm_agent) == disk_refs["weights-1"]


async def test_a_chunk_that_never_arrives_fails_within_the_timeout_and_a_disk_load_recovers(
    http, vllm_agent, tiny_models, disk_refs, tmp_path
):
    """The trainer joins, then never broadcasts: the worker's receive ends at the group's
    timeout, the agent reports the failure and not ready, and the engine keeps serving."""
    log = tmp_path / "trainer.log"
    trainer = _trainer(
        {"model_dir": str(tiny_models["weights-2"]), "port": free_port(), "relay_dir": str(tmp_path), "hold_s": 60}, log
    )
    try:
        init_info = await _wait_file(tmp_path / "init_info.json", trainer, log)
        init_info["timeout_s"] = 5.0  # the worker's own deadline, for its join and its receives
        status, body = await _admin(http, vllm_agent, "/init_weight_transfer_engine", {"init_info": init_info})
        assert status == 200, body
        status, body = await _admin(http, vllm_agent, "/start_weight_update")
        assert status == 200, body
        update_info = await _wait_file(tmp_path / "update_info.json", trainer, log)
        t0 = time.monotonic()
        status, body = await _admin(http, vllm_agent, "/update_weights", {"update_info": update_info})
        assert status == 502, body
        assert time.monotonic() - t0 < 60
    finally:
        trainer.kill()
        trainer.wait(timeout=10)

    assert await _weight_version(http, vllm_agent) is None  # the weights are now unknown
    status, _ = await call(http, "GET", vllm_agent.admin_url + "/readyz")
    assert status == 503
    status, _ = await call(http, "GET", vllm_agent.admin_url + "/healthz")
    assert status == 200
    await _complete(http, vllm_agent)  # still serves (which weights is unknown)
    assert await _load_from_disk(http, vllm_agent, tiny_models["weights-2"], "disk-2") == disk_refs["weights-2"]
    status, _ = await call(http, "GET", vllm_agent.admin_url + "/readyz")
    assert status == 200

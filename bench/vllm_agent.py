"""A real vLLM CPU agent for the benchmarks: `python -m rlcp.agent` on a model made on the spot
(`rlcp.harness.checkpoints.make_models`), one subprocess with its vLLM engine, as in production
(`rlcp.harness.processes.AgentProcess`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcp.harness.processes import AgentProcess

# About 125M parameters (500 MB in float32): hidden 768 over 12 heads (head_dim 64, above the
# CPU attention backend's 32), 4 KV heads, 12 layers, vocab 32k, untied embeddings.
MODEL_100M = dict(
    hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4
)
VOCAB_100M = 32000


def agent_config(model: Path, roots: list[Path], **engine: Any) -> dict[str, Any]:
    return {
        "agent_id": "bench-vllm",
        "allowed_roots": [str(r) for r in roots],
        "log_format": "json",
        "log_level": "warning",
        "timeouts": {"pause_s": 300, "control_s": 60, "weight_load_s": 600},
        "engine": {
            "kind": "vllm",
            "model": str(model),
            "served_model_name": "bench",
            "dtype": "float32",
            "max_model_len": 512,
            "gpu_memory_utilization": 0.2,
            "enforce_eager": True,
            "enable_lora": False,
        }
        | engine,
    }


def start_agent(config: dict[str, Any], workdir: Path) -> AgentProcess:
    return AgentProcess(config, workdir, token="bench-agent-token", start_timeout_s=600).start()

"""SimEngine's resolved configuration: what a vLLM 0.32 engine's `/server_info?config_format=json`
holds, for the keys a client reads (TRL's: `model_config.dtype`, `model_config.logprobs_mode`,
`weight_transfer_config`, `lora_config`, `parallel_config.data_parallel_size`) and those vLLM's
text form prints. Values are vLLM's defaults for a small model on the CPU with LoRA and the
`gloo` weight-transfer backend on, as the agent runs it; `config_overrides` (a test's, merged key
by key) makes members differ. Nothing here is enforced by SimEngine (it loads any number of
adapters): it is what the engine reports, not what it does.
"""

from __future__ import annotations

import copy
from typing import Any


def sim_vllm_config(model_name: str, world_size: int, max_running: int) -> dict[str, Any]:
    return {
        "model_config": {
            "model": model_name,
            "served_model_name": model_name,
            "tokenizer": model_name,
            "skip_tokenizer_init": False,
            "tokenizer_mode": "auto",
            "revision": None,
            "tokenizer_revision": None,
            "trust_remote_code": False,
            "dtype": "torch.float32",
            "max_model_len": 2048,
            "quantization": None,
            "quantization_config": None,
            "enforce_eager": True,
            "seed": 0,
            "logprobs_mode": "raw_logprobs",  # vLLM's default
            "pooler_config": None,
        },
        "cache_config": {"block_size": 16, "cache_dtype": "auto", "enable_prefix_caching": True},
        "parallel_config": {
            "tensor_parallel_size": world_size,
            "pipeline_parallel_size": 1,
            "data_parallel_size": 1,
            "decode_context_parallel_size": 1,
            "disable_custom_all_reduce": False,
            "world_size": world_size,
        },
        "scheduler_config": {"max_num_seqs": max_running, "enable_chunked_prefill": True},
        "device_config": {"device": "cpu"},
        "load_config": {"load_format": "auto", "download_dir": None},
        "lora_config": {
            "max_lora_rank": 16,
            "max_loras": 4,
            "max_cpu_loras": 4,
            "fully_sharded_loras": False,
            "lora_dtype": "auto",
        },
        "speculative_config": None,
        "weight_transfer_config": {"backend": "gloo"},
        "kv_transfer_config": None,
    }


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` laid over it, object by object (a non-object value replaces)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out

"""`GET /server_info`, as vLLM 0.32 serves it (`vllm/entrypoints/serve/dev/server_info/api_router.py`,
behind `VLLM_SERVER_DEV_MODE=1`), shared by the agent (one engine's) and the controller's facade
(the fleet's).

vLLM answers `{"vllm_config", "vllm_env", "system_env"}`; `vllm_config` is the resolved
`VllmConfig` as a JSON tree with `?config_format=json` (pydantic's dump, `torch.dtype` values as
strings: `"torch.float32"`), and by default (`text`) the string `str(VllmConfig)`, a line of
`key=value, ` pairs. TRL's clients read the JSON tree: `model_config.dtype`,
`model_config.logprobs_mode`, `weight_transfer_config`, `lora_config` (`max_loras`,
`max_lora_rank`), `parallel_config.data_parallel_size`.

A config the engine gives only as JSON (SimEngine's, the fleet's common one) is rendered as text
with `config_text`: the pairs vLLM 0.32's `VllmConfig.__str__` prints, in its order, each read
from the JSON tree (the objects vLLM prints with their repr appear as JSON here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ConfigFormat = Literal["text", "json"]


class ServerInfoQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config_format: ConfigFormat = Field(
        "text", description="`json`: `vllm_config` as a JSON tree; `text` (vLLM's default): as `str(VllmConfig)`."
    )


class ServerInfoAnswer(BaseModel):
    model_config = ConfigDict(extra="allow")
    vllm_config: dict[str, Any] | str = Field(description="The resolved VllmConfig: a JSON tree, or its text form.")
    vllm_env: dict[str, Any] = Field(description="vLLM's own: the process's VLLM_* variables.")
    system_env: dict[str, Any] = Field(description="vLLM's own: `vllm collect-env`'s report.")


# (label, path in the JSON tree), as vLLM 0.32's `VllmConfig.__str__` (vllm/config/vllm.py) prints them.
TEXT_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "model_config.model"),
    ("speculative_config", "speculative_config"),
    ("tokenizer", "model_config.tokenizer"),
    ("skip_tokenizer_init", "model_config.skip_tokenizer_init"),
    ("tokenizer_mode", "model_config.tokenizer_mode"),
    ("revision", "model_config.revision"),
    ("tokenizer_revision", "model_config.tokenizer_revision"),
    ("trust_remote_code", "model_config.trust_remote_code"),
    ("dtype", "model_config.dtype"),
    ("max_seq_len", "model_config.max_model_len"),
    ("download_dir", "load_config.download_dir"),
    ("load_format", "load_config.load_format"),
    ("tensor_parallel_size", "parallel_config.tensor_parallel_size"),
    ("pipeline_parallel_size", "parallel_config.pipeline_parallel_size"),
    ("data_parallel_size", "parallel_config.data_parallel_size"),
    ("decode_context_parallel_size", "parallel_config.decode_context_parallel_size"),
    ("dcp_comm_backend", "parallel_config.dcp_comm_backend"),
    ("disable_custom_all_reduce", "parallel_config.disable_custom_all_reduce"),
    ("quantization", "model_config.quantization"),
    ("quantization_config", "model_config.quantization_config"),
    ("enforce_eager", "model_config.enforce_eager"),
    ("aux_output_config", "aux_output_config"),
    ("kv_cache_dtype", "cache_config.cache_dtype"),
    ("device_config", "device_config.device"),
    ("structured_outputs_config", "structured_outputs_config"),
    ("observability_config", "observability_config"),
    ("seed", "model_config.seed"),
    ("served_model_name", "model_config.served_model_name"),
    ("enable_prefix_caching", "cache_config.enable_prefix_caching"),
    ("enable_chunked_prefill", "scheduler_config.enable_chunked_prefill"),
    ("pooler_config", "model_config.pooler_config"),
    ("compilation_config", "compilation_config"),
    ("kernel_config", "kernel_config"),
)
_ABSENT = object()


def at_path(tree: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """`tree["a"]["b"]` for `"a.b"`; `default` where a step is missing or not an object."""
    node: Any = tree
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def config_text(config: Mapping[str, Any]) -> str:
    """The text form of a JSON `vllm_config`: vLLM's pairs, strings quoted as vLLM quotes the
    ones it prints with repr, a field missing from the tree left out."""
    pairs = []
    for label, path in TEXT_FIELDS:
        value = at_path(config, path, _ABSENT)
        if value is _ABSENT:
            continue
        if isinstance(value, dict | list):
            shown = json.dumps(value, sort_keys=True, separators=(",", ":"))
        elif value is None:
            shown = "None"
        elif label in ("model", "tokenizer", "download_dir") and isinstance(value, str):
            shown = repr(value)
        else:
            shown = str(value)
        pairs.append(f"{label}={shown}")
    return ", ".join(pairs)

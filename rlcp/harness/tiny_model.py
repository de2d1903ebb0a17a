"""Make a tiny Llama model, its tokenizer and LoRA adapters on local disk.

No model can be downloaded on our machines (and a demo should not need one), so the
tests, the local fleet and the benchmarks build what they serve: a byte-level BPE
tokenizer trained on a few sentences, a `LlamaForCausalLM` with random weights saved
as safetensors, and PEFT-format LoRA adapters written by hand. Different seeds give
different weights, which is what a weight-update test needs to tell versions apart.

    python -m rlcp.harness.tiny_model OUT_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Reinforcement learning updates the policy after every step.",
    "A fleet of inference engines serves rollouts to the trainer.",
    "Weights move from the trainer to every engine in the fleet.",
    "Pause, update, verify and resume: one call per training step.",
    "Hello world! 0123456789 + - * / = ( ) [ ] { } < > ? , . ; :",
]

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# The CPU attention backend needs a head_dim of at least 32: hidden 64 over 2 heads.
_DEFAULT_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
)
MAX_POSITIONS = 1024  # the model's context limit, which the engines serve it at

# How vLLM serves the tiny model, wherever it runs (the test agents, `vllm serve`, the Dynamo
# worker, the local fleet, the benchmarks): engine arguments by their Python names.
SERVED_NAME = "tiny"
ENGINE_ARGS: dict[str, Any] = {"dtype": "float32", "max_model_len": MAX_POSITIONS, "enforce_eager": True}
# max_loras 3: TRL's adapter-only sync holds max_staleness + 2 adapters at once, and its staleness must
# be at least 1 (tests/e2e/test_trl_async.py; docs/trainer-guide.md, "TRL").
LORA_ARGS: dict[str, Any] = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 3}


def agent_engine(model: Path, **overrides: Any) -> dict[str, Any]:
    """An agent's `engine` settings section serving the tiny model at `model`, adapters on."""
    return {
        "kind": "vllm",
        "model": str(model),
        "served_model_name": SERVED_NAME,
        "gpu_memory_utilization": 0.2,
        # The EngineCore forked from the agent, which has imported vLLM already: an agent starts
        # with ~26 CPU-s instead of ~41 (its EngineCore ~6 instead of ~21; vLLM's CPU platform
        # would spawn it, and the spawned process imports vLLM and torch again).
        "engine_core_start": "fork",
        **ENGINE_ARGS,
        **LORA_ARGS,
        **overrides,
    }


def serve_flags(*, lora: bool = True) -> list[str]:
    """The same engine as `vllm serve` flags (after `--model`); `lora`: adapters on."""
    flags = ["--served-model-name", SERVED_NAME]
    for name, value in {**ENGINE_ARGS, **(LORA_ARGS if lora else {})}.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def make_tokenizer(out_dir: Path, vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 8, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def make_weights(
    out_dir: Path,
    seed: int,
    *,
    vocab_size: int,
    max_positions: int = MAX_POSITIONS,
    shape: dict[str, Any] | None = None,
) -> None:
    """Save a randomly initialised Llama (config + safetensors) made with `seed`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
        **(shape or _DEFAULT_SHAPE),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # A larger init spread than the default makes greedy outputs differ clearly between seeds.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out_dir, safe_serialization=True)


def make_lora(out_dir: Path, base_model: Path, seed: int, rank: int = 8) -> None:
    """Write a PEFT LoRA adapter on q/v projections of `base_model`, random A and B."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((base_model / "config.json").read_text())
    hidden = config["hidden_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv_out = head_dim * config["num_key_value_heads"]
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for proj, out_features in (("q_proj", hidden), ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=gen) * 0.5
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": rank,
                "lora_alpha": rank * 2,
                "lora_dropout": 0.0,
                "bias": "none",
                "target_modules": ["q_proj", "v_proj"],
                "base_model_name_or_path": str(base_model),
                "fan_in_fan_out": False,
                "inference_mode": True,
            }
        )
    )


def make_model_family(
    root: Path, *, weight_seeds: tuple[int, ...] = (1, 2), lora_seeds: tuple[int, ...] = (11, 12)
) -> dict[str, Path]:
    """Build `root/base` (tokenizer + weights of the first seed), one weights-only dir per
    seed (`root/weights-<seed>`, for disk updates), and one LoRA dir per LoRA seed."""
    root.mkdir(parents=True, exist_ok=True)
    base = root / "base"
    base.mkdir(exist_ok=True)
    make_tokenizer(base)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(base))
    paths: dict[str, Path] = {"base": base}
    make_weights(base, weight_seeds[0], vocab_size=vocab)
    for seed in weight_seeds:
        d = root / f"weights-{seed}"
        make_weights(d, seed, vocab_size=vocab)
        paths[f"weights-{seed}"] = d
    for seed in lora_seeds:
        d = root / f"lora-{seed}"
        make_lora(d, base, seed)
        paths[f"lora-{seed}"] = d
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    for name, path in make_model_family(args.out_dir).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()

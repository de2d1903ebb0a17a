"""Weights, adapters and models made on the spot (no model can be downloaded here).

- `write_checkpoint`: a small real safetensors checkpoint; SimEngine digests its bytes, so each
  seed is a distinct version.
- `write_adapter`: the files of a LoRA adapter as SimEngine reads them.
- `write_perturbed`: a real model's weights plus noise, what a trainer writes after a step.
- `make_models`: a Llama (tokenizer + weights) and further weight sets for real vLLM engines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def write_checkpoint(directory: Path, seed: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    save_file(
        {
            "model.embed.weight": rng.standard_normal((8, 4)).astype(np.float32),
            "model.layers.0.weight": rng.standard_normal((4, 4)).astype(np.float32),
        },
        str(directory / "model.safetensors"),
    )
    return directory


def write_adapter(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    return directory


def write_perturbed(base: Path, directory: Path, seed: int, scale: float) -> Path:
    """`base`'s weights plus Gaussian noise of standard deviation `scale`."""
    rng = np.random.default_rng(seed)
    tensors = {
        name: (t + rng.normal(0.0, scale, t.shape)).astype(t.dtype)
        for name, t in load_file(str(base / "model.safetensors")).items()
    }
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def make_models(
    root: Path, *, shape: dict[str, int] | None, vocab_size: int | None, seeds: tuple[int, ...]
) -> dict[str, Path]:
    """`root/base` (tokenizer + weights of seeds[0]) and `root/weights-<seed>` for each seed.
    `shape=None`: the tests' tiny Llama (`rlcp.harness.tiny_model`)."""
    from transformers import AutoTokenizer

    from rlcp.harness.tiny_model import make_tokenizer, make_weights

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

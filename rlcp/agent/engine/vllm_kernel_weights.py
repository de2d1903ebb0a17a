"""The weights vLLM's CPU kernels compute with, read back by probing, for the weight checksums.

On the CPU, vLLM 0.32 repacks every unquantized linear layer's weight for its kernel
(`dispatch_cpu_unquantized_gemm` in `model_executor/layers/utils.py`, called by
`UnquantizedLinearMethod.process_weights_after_loading` with `remove_weight=True`): a oneDNN
handler, an SGL packed tensor or a zentorch prepacked tensor, held in the closure
`layer.cpu_linear`, and `layer.weight` becomes `torch.empty(0)`. vLLM's
`compute_weight_checksums` then hashes no bytes for those layers (sha256(b"")): the attention
and MLP weights would never be compared. Nothing exposes the packed layout, and a packed
layout's bytes would not be comparable with a GPU worker's or a checkpoint's anyway.

So the weight is recovered through the kernel itself: `cpu_linear(I_K, <empty>, None)` is
`I_K @ W^T = W^T`, exactly, in any accumulation order and precision (each output is one
product with 1.0 plus products with 0.0). Its transpose, contiguous in the layer's dtype, is
the (N, K) tensor a GPU worker would hash under the same key; for vLLM's merged layers
(`qkv_proj`, `gate_up_proj`) that is the concatenation of the checkpoint's tensors along the
output dimension, as vLLM loads them. Two caveats of exactness: a -0.0 weight reads back as
+0.0, and a non-finite weight (inf, NaN) turns its whole output row to NaN (0 * inf) -- still
deterministic, so equal engines agree, but no longer the checkpoint's bytes.

Cost: one K-token forward through each repacked layer (K its input size), done in blocks of
identity rows so that no block's input or output exceeds `_BLOCK_BYTES`, plus one copy of the
layer's weight at a time. For the tiny test model this is milliseconds; for a 7B model on a
CPU, seconds per checksum call.

torch only; vLLM's modules are read by attribute, so a vLLM upgrade that renames them shows up
as layers no longer probed (their empty digests stay, and the agent warns).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it runs: importing this module stays cheap for the agent
    import torch

_BLOCK_BYTES = 64 << 20  # the largest probe input or output block


def repacked_layers(model: Any) -> Iterator[tuple[str, Any]]:
    """(parameter name of the weight, module) of every layer whose weight vLLM moved into its CPU
    kernel. The names are `named_parameters`' (a LoRA-wrapped layer's `...qkv_proj.base_layer.weight`),
    which are vLLM's checksum keys."""
    for name, module in model.named_modules():
        # The layer's own parameter: a LoRA wrapper answers `weight` and `cpu_linear` too, from its
        # `base_layer`, which is probed under the parameter's own name.
        weight = dict(module.named_parameters(recurse=False)).get("weight")
        if (
            callable(getattr(module, "cpu_linear", None))
            and weight is not None
            and weight.numel() == 0
            and isinstance(getattr(module, "input_size_per_partition", None), int)
        ):
            yield f"{name}.weight" if name else "weight", module


def kernel_weight(module: Any) -> torch.Tensor:
    """The (N, K) weight `module.cpu_linear` multiplies by, in the layer's dtype."""
    import torch

    empty: torch.Tensor = module.weight
    k: int = module.input_size_per_partition
    dtype, device = empty.dtype, empty.device
    itemsize = torch.empty((), dtype=dtype).element_size()
    n: int | None = None
    weight: torch.Tensor | None = None
    start = 0
    with torch.inference_mode():
        while start < k:
            # The output's width N is known only after the first block: size that one by K alone.
            rows = max(1, min(k - start, _BLOCK_BYTES // (itemsize * max(k, n or 1))))
            probe = torch.zeros(rows, k, dtype=dtype, device=device)
            probe[:, start : start + rows].fill_diagonal_(1)
            out = module.cpu_linear(probe, empty, None)  # rows of W^T; the bias is left out
            if weight is None:
                n = out.shape[-1]
                weight = torch.empty(n, k, dtype=dtype, device=device)
            weight[:, start : start + rows] = out.t()
            start += rows
    assert weight is not None  # k >= 1
    return weight

"""The two places TRL 1.16.0's `AsyncGRPOTrainer` cannot run on a CPU, and what stands in for each.

Read from TRL's own code (`trl/experimental/async_grpo/`), in the order a run meets them. Everything
else in the trainer runs as shipped on CPU: accelerate picks the CPU device, the rollout process is
CUDA-free by design (`CUDA_VISIBLE_DEVICES=""`), adapter-only sync is HTTP and files (no NCCL), and
the bf16 default is a config flag (`bf16=False`, with `dtype="float32"` to match the engines).

1. **Peak-FLOPs probing** (`AsyncGRPOTrainer.__init__` calls `trl.trainer.utils.get_peak_flops_per_device`,
   which calls `torch.cuda.get_device_name(accelerator.device)`): on a CPU build of torch that raises
   ("Torch not compiled with CUDA enabled") before the trainer exists. TRL's own answer for a device it
   has no figure for is `None` (MFU metrics off, "throughput and timing metrics are still reported");
   the stand-in returns exactly that. Nothing else reads the value.
2. **The attention kernel of training** (`packing.py`): the trainer forwards its packed prefix trees
   through `tree_attention`, which calls `_flash_attn().flash_attn_varlen_func(...)`, and `_flash_attn`
   downloads FlashAttention-3 from the Hub with the `kernels` package (`kernels-community/flash-attn3`:
   CUDA only, and no network here). The stand-in is `_flash_attn` returning the same function computed
   by torch's `scaled_dot_product_attention`, one segment at a time: the same inputs (each segment's
   queries against the K/V rows of its root-to-segment path, `cu_seqlens` boundaries, GQA heads),
   FlashAttention's bottom-right-aligned causal mask and sliding window. Slower, and the same maths.

Each is one module attribute replaced (`install`), named here, in the run's banner and in
docs/trainer-guide.md ("TRL"). On a GPU neither is needed: `install(cuda=True)` changes nothing.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

STAND_INS = (
    "trl.experimental.async_grpo.async_grpo_trainer.get_peak_flops_per_device -> None (TRL's 'unknown device')",
    "trl.experimental.async_grpo.packing._flash_attn -> FlashAttention-3's varlen function in torch SDPA",
)


def peak_flops_unknown(accelerator: Any, dtype: str) -> None:
    """TRL's answer for a device it has no peak-FLOPs figure for (MFU off), without asking CUDA."""
    return None


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: Any = None,
    max_seqlen_k: Any = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    **_: Any,
) -> Any:
    """FlashAttention's `flash_attn_varlen_func` on any torch device: `q` is (total_q, heads, dim),
    `k`/`v` (total_k, kv_heads, dim); segment i's queries are `q[cu_q[i]:cu_q[i+1]]` and its keys
    `k[cu_k[i]:cu_k[i+1]]`. Causal is aligned bottom-right, as FlashAttention's: the last query sees
    every key, so a segment's queries see their whole path and themselves."""
    import torch
    import torch.nn.functional as F

    if softcap:
        raise NotImplementedError("the CPU stand-in for FlashAttention has no softcap")
    groups = q.shape[1] // k.shape[1]
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    left, right = window_size
    outs = []
    for i in range(len(bounds_q) - 1):
        qi = q[bounds_q[i] : bounds_q[i + 1]].transpose(0, 1)
        ki = k[bounds_k[i] : bounds_k[i + 1]].transpose(0, 1).repeat_interleave(groups, dim=0)
        vi = v[bounds_k[i] : bounds_k[i + 1]].transpose(0, 1).repeat_interleave(groups, dim=0)
        n_q, n_k = qi.shape[1], ki.shape[1]
        q_pos = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
        k_pos = torch.arange(n_k, device=q.device)[None, :]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
        if causal:
            allowed &= k_pos <= q_pos
        elif right >= 0:
            allowed &= k_pos <= q_pos + right
        if left >= 0:
            allowed &= k_pos >= q_pos - left
        out = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=allowed, scale=softmax_scale)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs, dim=0)


def install(*, cuda: bool = False) -> tuple[str, ...]:
    """Put the CPU stand-ins in place (none with `cuda`); the names of what was replaced."""
    if cuda:
        return ()
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    async_grpo_trainer.get_peak_flops_per_device = peak_flops_unknown
    packing._flash_attn = lambda: SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)
    return STAND_INS

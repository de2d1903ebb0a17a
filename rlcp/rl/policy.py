"""The policy in plain torch: token logprobs, group-normalised advantages, the clipped loss.

The trainer holds the same Llama the engines serve (transformers' `LlamaForCausalLM`, float32)
and scores the tokens the engines sampled. The engine's logprob of each sampled token is the
behaviour policy (the weights that actually produced it, whichever version that was); the
loss is GRPO's clipped policy gradient over every completion token with the behaviour policy
decoupled from the proximal one, so tokens sampled by older weights (an asynchronous run)
are importance-weighted, not thrown away and not clipped to a zero gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CLIP = 0.2  # PPO's clip range on the ratio to the proximal policy
IS_CAP = 2.0  # truncated importance sampling: the largest weight a behaviour -> proximal ratio gives a token


def load_policy(model_dir: str, device: str = "cpu") -> Any:
    """The Llama at `model_dir` (safetensors, as the engines load it), float32, on `device`."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a loading bar would sit between the run's own lines
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    model.train()  # the tiny config has no dropout: train mode changes nothing it computes
    return model


def token_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    weights: dict[str, Any] | None = None,
) -> list[Any]:
    """Per completion, the model's logprob of each of its tokens after its prompt (a 1-d
    tensor each, with the graph kept for a backward pass). One padded forward pass; with
    `weights` (parameter name -> tensor), under those instead of the model's own."""
    import torch
    from torch.func import functional_call

    device = next(model.parameters()).device
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, device=device)
        mask[i, : len(s)] = 1
    # Right padding: a real token never attends to a pad (causal), so its logits are exact.
    inputs = {"input_ids": ids, "attention_mask": mask}
    output = (
        model(**inputs) if weights is None else functional_call(model, weights, args=(), kwargs=inputs, strict=False)
    )
    logp = torch.log_softmax(output.logits.float(), dim=-1)
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        # The logits at position t predict token t + 1.
        pos = torch.arange(len(p) - 1, len(p) + len(c) - 1, device=device)
        out.append(logp[i, pos, torch.tensor(list(c), device=device)])
    return out


def group_advantages(rewards: Sequence[float], group: int, eps: float = 1e-6) -> list[float]:
    """GRPO's advantages: each reward less its group's mean, over the group's standard deviation
    (groups are `group` consecutive completions of one prompt; a group of equal rewards gives 0)."""
    out: list[float] = []
    for g in range(0, len(rewards), group):
        rs = rewards[g : g + group]
        mean = sum(rs) / len(rs)
        std = (sum((r - mean) ** 2 for r in rs) / len(rs)) ** 0.5
        out += [(r - mean) / (std + eps) for r in rs]
    return out


def clipped_pg_loss(
    new: Sequence[Any],
    behaviour: Sequence[Sequence[float]],
    advantages: Sequence[float],
    keep: Sequence[Sequence[bool]] | None = None,
    clip: float = CLIP,
    is_cap: float = IS_CAP,
) -> Any:
    """The clipped policy-gradient loss with the behaviour policy decoupled (AReaL's decoupled
    PPO objective), a mean over the kept tokens.

    `new`: the trainer's token logprobs (with grad) under its current weights, which are also
    the proximal policy the ratio is clipped against; `behaviour`: the engine's logprobs of the
    same tokens (the weights that sampled them). Each token is weighted by the truncated
    importance ratio behaviour -> proximal (`is_cap`), which corrects tokens an older version
    sampled without letting PPO's clip zero their gradient: on-policy it is 1 and this is plain
    GRPO. `keep`: which tokens count (a token from weights past the staleness bound does not)."""
    import torch

    total, count = None, 0
    for i, lp in enumerate(new):
        old = torch.tensor(behaviour[i], dtype=lp.dtype, device=lp.device)
        proximal = lp.detach()
        weight = torch.clamp(torch.exp(proximal - old), max=is_cap)
        ratio = torch.exp(lp - proximal)  # 1 here; its gradient is lp's
        adv = advantages[i]
        term = -weight * torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
        if keep is not None:
            term = term[torch.tensor(keep[i], dtype=torch.bool, device=lp.device)]
        total = term.sum() if total is None else total + term.sum()
        count += term.numel()
    if total is None or count == 0:
        return torch.zeros((), requires_grad=True)
    return total / count

"""The CPU stand-in for FlashAttention-3 in TRL's training forward (`rlcp.rl.trl.cpu`): on the tiny
Llama, a packed prefix tree through TRL's own `tree_attention` with the stand-in gives each sample the
logits plain causal attention gives it alone."""

from __future__ import annotations

import pytest

pytest.importorskip("trl", reason="the trl extra")


def test_tree_attention_on_the_stand_in_matches_causal_attention(tiny_models):
    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.packing import TREE_ATTENTION, TreeRow, register_tree_attention

    from rlcp.rl.trl import cpu

    cpu.install()
    register_tree_attention()
    base = tiny_models["base"]
    plain = AutoModelForCausalLM.from_pretrained(base, attn_implementation="sdpa", dtype=torch.float32)
    tree = AutoModelForCausalLM.from_pretrained(base, attn_implementation=TREE_ATTENTION, dtype=torch.float32)
    samples = [[5, 9, 17, 33, 40, 41], [5, 9, 17, 50, 51], [7, 8]]
    row = TreeRow()
    for ids in samples:
        n = len(ids)
        row.add(
            {
                "input_ids": torch.tensor(ids),
                "completion_mask": torch.tensor([0] + [1] * (n - 1)),
                "old_log_probs": torch.zeros(n),
                "advantage": 1.0,
                "group_id": 0,
            }
        )
    packed = row.pack()
    with torch.no_grad():
        logits = tree(
            input_ids=packed["input_ids"][None],
            position_ids=packed["position_ids"][None],
            tree_kv_index=packed["tree_kv_index"],
            tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
            tree_cu_seqlens_k=packed["tree_cu_seqlens_k"],
            tree_max_seqlen_q=int(packed["tree_max_seqlens"][0]),
            tree_max_seqlen_k=int(packed["tree_max_seqlens"][1]),
        ).logits[0]
        for ids, nodes in zip(samples, row.sample_nodes, strict=True):
            where = [_position(row, n) for n in nodes]
            alone = plain(input_ids=torch.tensor([ids])).logits[0]
            assert (logits[where] - alone).abs().max() < 1e-4


def _position(row, node: int) -> int:
    """The packed position of trie node `node` (DFS pre-order, as `TreeRow.pack` lays it out)."""
    order = []
    stack = list(reversed(row.roots.values()))
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(reversed(row.children[n].values()))
    return order.index(node)

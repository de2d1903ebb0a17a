"""The task the run learns: make one target token the policy's favourite.

The reward of a completion is the share of its tokens equal to a target token. A random
tiny Llama samples it about once in 500 tokens (1 / vocabulary), so the first steps' reward
is near 0; since every completion token is rewarded on its own, the policy gradient has a
dense signal and the target's logit rises in every context. Plain policy gradient with
group-normalised advantages takes the tiny Llama to ~0.9 in a few dozen steps on 2 CPU
cores. It is a task chosen to learn in minutes, not to be interesting: what the run shows
is that the learning happens through the fleet, on the weights the trainer pushed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Prompts the run cycles through (texts the tiny model's tokenizer was trained on).
PROMPT_TEXTS = (
    "The quick brown fox",
    "Reinforcement learning updates",
    "A fleet of inference engines",
    "Weights move from the trainer",
    "Pause, update, verify and resume",
    "Hello world!",
    "The policy after every step",
    "One call per training step",
)
TARGET_TEXT = "!"  # one token of the tiny tokenizer's vocabulary


@dataclass(frozen=True)
class TargetTokenTask:
    """Prompts as token ids, and the target token the reward counts."""

    prompts: tuple[tuple[int, ...], ...]
    target: int

    def reward(self, completion: Sequence[int]) -> float:
        """The share of `completion`'s tokens equal to the target (0 for an empty one)."""
        return sum(t == self.target for t in completion) / len(completion) if completion else 0.0

    def prompts_for(self, step: int, count: int) -> list[tuple[int, ...]]:
        """The `count` prompts of step `step` (1-based): the prompt list, round and round."""
        start = (step - 1) * count
        return [self.prompts[(start + i) % len(self.prompts)] for i in range(count)]


def make_task(tokenizer_dir: str) -> TargetTokenTask:
    """The task over the tokenizer in `tokenizer_dir` (the tiny model's)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    target = tok.encode(TARGET_TEXT, add_special_tokens=False)
    if len(target) != 1:
        raise ValueError(f"the target {TARGET_TEXT!r} is {len(target)} tokens in {tokenizer_dir}, not one")
    return TargetTokenTask(tuple(tuple(tok.encode(t, add_special_tokens=False)) for t in PROMPT_TEXTS), target[0])

"""`python -m bench.trl_loss_standin`: a plain-torch STAND-IN of TRL's AsyncGRPO loss, not TRL.

What it is for: choosing the settings of TRL's own knobs (`AsyncGRPOConfig`) under which the reward of
`rlcp.rl.trl`'s run climbs, cheaply and over many seeds, without engines. What it reproduces of TRL
1.16.0's `AsyncGRPOTrainer` (read from `trl/experimental/async_grpo/`), and nothing more:

- the policy: the tiny Llama (`rlcp.harness.tiny_model`, the base weights the engines serve) with PEFT's
  LoRA as `rlcp.rl.trl.run` builds it (r 8, alpha 16, the seven projections), `set_seed(seed)` first;
- the rollouts: per step `prompts` groups of `group` completions of at most `max_tokens` tokens, the
  prompts in dataset order (TRL's `_repeat_iterator`), rendered through the chat template, sampled at
  `temperature` (stopping at EOS, which counts as a token, as vLLM returns it); the behaviour
  logprobs are the sampling policy's as the engines return them (`--logprobs`: vLLM's default, the
  tests' engines', is "raw", before temperature; TRL's own `vllm serve` script asks for "processed");
- staleness as TRL's rollout process makes it with a one-step queue: step 1 trains on the first
  policy's samples, step k >= 2 on samples of the policy before the previous update (one version old);
  `--staleness 0` is on-policy;
- the reward: `rlcp.rl.trl.rollouts.TargetReward` (the share of completion tokens equal to `!`); the
  advantage: (r - mean) / (std + 1e-8) per group (population std), as `_score_group`;
- the loss: `compute_loss`'s: -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A) summed
  over the batch's completion tokens, over their count; one optimizer step per batch; AdamW (torch's, as
  transformers' Trainer builds it: betas 0.9/0.999, no weight decay), constant learning rate,
  gradient norm clipped at 1.0;
- the logged reward of a step: the mean reward of the samples it trained on (TRL's `reward`).

What it does not reproduce: vLLM's sampler and kernels (its logprobs differ from torch's slightly),
the timing by which a group is sometimes two versions old and dropped, TRL's packing. A setting is
only chosen here; the real run (tests/e2e/test_trl_async.py) decides.

    python -m bench.trl_loss_standin --seeds 0-7 --lr 5e-2 --epsilon-high 0.2
    python -m bench.trl_loss_standin --sweep        # the grid below, 8 seeds each
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

MARGIN = 0.05  # tests/e2e/test_trl_async.py's: last three steps' mean over the first three's


@dataclass(frozen=True)
class Knobs:
    lr: float = 5e-2
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    group: int = 8  # num_generations
    prompts: int = 4  # groups per step
    max_tokens: int = 16  # max_completion_length
    temperature: float = 1.0
    staleness: int = 1
    steps: int = 20
    # What the engines return as a sample's logprob (TRL's `old_log_probs`): vLLM's default "raw" is
    # the model's, before temperature (what the tests' engines serve); "processed" is after it (the
    # `--logprobs-mode processed_logprobs` TRL's own `vllm serve` script sets). Equal at temperature 1.
    logprobs: str = "raw"

    def label(self) -> str:
        return (
            f"lr {self.lr:g} eps {self.epsilon:g}/{self.epsilon_high:g} G{self.group}x{self.prompts} "
            f"T{self.max_tokens} temp {self.temperature:g} stale {self.staleness} steps {self.steps}"
            + (f" {self.logprobs} logprobs" if self.temperature != 1 else "")
        )


def build(model_dir: Path) -> tuple[Any, list[list[int]], int, int, int]:
    """The tokenizer's view of the task: chat-rendered prompt ids, the target, EOS and PAD ids."""
    from transformers import AutoTokenizer

    from rlcp.rl.task import PROMPT_TEXTS, make_task

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        for t in PROMPT_TEXTS
    ]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    return tok, prompts, make_task(str(model_dir)).target, tok.eos_token_id, tok.pad_token_id


def run(model_dir: Path, knobs: Knobs, seed: int, sample_seed: int) -> list[float]:
    """One run's per-step reward."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, set_seed

    # The run's own adapter targets. `rlcp.rl.trl` is outside the packages mypy checks (it imports TRL,
    # which is untyped), so it is imported by name rather than followed.
    lora_targets: list[str] = importlib.import_module("rlcp.rl.trl.run").LORA_TARGETS

    _, prompts, target, eos, pad = build(model_dir)
    set_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=lora_targets))
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=knobs.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    gen = torch.Generator().manual_seed(sample_seed)
    lora = [n for n, p in policy.named_parameters() if p.requires_grad]
    snapshots: list[dict[str, torch.Tensor]] = []  # the adapter after 0, 1, 2... updates
    state = dict(policy.named_parameters())

    def snapshot() -> dict[str, torch.Tensor]:
        return {n: state[n].detach().clone() for n in lora}

    def load(snap: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, t in snap.items():
                state[n].copy_(t)

    def sample(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[float], list[float]]:
        rows: list[list[int]] = []
        starts: list[int] = []
        for g in range(knobs.prompts):
            p = prompts[((step - 1) * knobs.prompts + g) % len(prompts)]
            rows += [list(p)] * knobs.group
            starts += [len(p)] * knobs.group
        width = max(starts)
        # Left-pad so every row's completion starts at the same column; the attention mask hides the pad.
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        prompt_mask = mask
        done = torch.zeros(len(rows), dtype=torch.bool)
        out, outmask, lps = [], [], []
        with torch.no_grad():
            past = None
            cur_ids, cur_mask = ids, mask
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            cur_pos = pos
            for _ in range(knobs.max_tokens):
                o = policy(input_ids=cur_ids, attention_mask=cur_mask, position_ids=cur_pos, past_key_values=past)
                past = o.past_key_values
                logp = torch.log_softmax(o.logits[:, -1].float() / knobs.temperature, -1)
                tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
                live = ~done
                out.append(torch.where(live, tok, torch.full_like(tok, pad)))
                outmask.append(live.clone())
                engine = logp if knobs.logprobs == "processed" else torch.log_softmax(o.logits[:, -1].float(), -1)
                lps.append(engine.gather(1, tok[:, None]).squeeze(1))
                done = done | (tok == eos)
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], 1)
                cur_ids, cur_mask = tok[:, None], mask
                cur_pos = cur_pos[:, -1:] + 1
        comp = torch.stack(out, 1)
        cmask = torch.stack(outmask, 1)
        old = torch.stack(lps, 1)
        rewards = [
            sum(int(t) == target for t, m in zip(comp[i], cmask[i], strict=True) if m) / max(int(cmask[i].sum()), 1)
            for i in range(len(rows))
        ]
        adv: list[float] = []
        for g in range(knobs.prompts):
            r = rewards[g * knobs.group : (g + 1) * knobs.group]
            mean, std = statistics.fmean(r), statistics.pstdev(r)
            adv += [(x - mean) / (std + 1e-8) for x in r]
        full = torch.cat([ids, comp], 1)
        full_mask = torch.cat([prompt_mask, cmask.long()], 1)
        return full, full_mask, old, rewards, adv

    snapshots.append(snapshot())
    rewards_by_step: list[float] = []
    for step in range(1, knobs.steps + 1):
        version = max(0, step - 1 - knobs.staleness)  # updates the sampling policy had seen
        current = snapshot()
        load(snapshots[version])
        full, full_mask, old, rewards, adv = sample(step)
        load(current)
        rewards_by_step.append(statistics.fmean(rewards))
        width = full.shape[1] - old.shape[1]
        cmask = full_mask[:, width:].bool()
        pos = (full_mask.cumsum(1) - 1).clamp(min=0)
        logits = policy(input_ids=full, attention_mask=full_mask, position_ids=pos).logits.float()
        logp_all = torch.log_softmax(logits[:, width - 1 : -1] / knobs.temperature, -1)
        logp = logp_all.gather(2, full[:, width:, None]).squeeze(2)
        a = torch.tensor(adv)[:, None].expand_as(logp)
        ratio = torch.exp(logp - old)
        clipped = torch.clamp(ratio, 1 - knobs.epsilon, 1 + knobs.epsilon_high)
        per_token = torch.where(cmask, -torch.min(ratio * a, clipped * a), 0.0)
        loss = per_token.sum() / cmask.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        snapshots.append(snapshot())
    return rewards_by_step


def gain(rewards: list[float]) -> float:
    return statistics.fmean(rewards[-3:]) - statistics.fmean(rewards[:3])


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def evaluate(model_dir: Path, knobs: Knobs, seeds: list[int], *, verbose: bool) -> dict[str, Any]:
    t0 = time.monotonic()
    curves = {s: run(model_dir, knobs, seed=s, sample_seed=1000 + s) for s in seeds}
    gains = [gain(c) for c in curves.values()]
    result = {
        "knobs": asdict(knobs),
        "gains": [round(g, 3) for g in gains],
        "climbed": sum(g > MARGIN for g in gains),
        "of": len(gains),
        "min_gain": round(min(gains), 3),
        "s": round(time.monotonic() - t0, 1),
    }
    print(f"{knobs.label():80s} climbed {result['climbed']}/{len(gains)}  gains {result['gains']}", flush=True)
    if verbose:
        for s, c in curves.items():
            print(f"  seed {s}: " + " ".join(f"{r:.3f}" for r in c), flush=True)
    return result


SWEEP: dict[str, list[Any]] = {
    "lr": [3e-2, 5e-2],
    "epsilon_high": [0.2, 0.28, 1.0, 5.0],
    "group": [8, 16],
}


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0-7"))
    p.add_argument("--model-dir", type=Path, help="the tiny model's base dir (default: built in a temp dir)")
    for f, v in asdict(Knobs()).items():
        p.add_argument("--" + f.replace("_", "-"), type=type(v), default=v)
    p.add_argument("--sweep", action="store_true", help="the SWEEP grid over the other knobs given")
    p.add_argument("--verbose", action="store_true", help="every seed's curve")
    p.add_argument("--json", type=Path, help="append each result as a JSON line here")
    a = p.parse_args()
    torch.set_num_threads(1)
    knobs = Knobs(**{f: getattr(a, f) for f in asdict(Knobs())})
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = a.model_dir
        if model_dir is None:
            from rlcp.harness.tiny_model import make_model_family

            model_dir = make_model_family(Path(tmp), weight_seeds=(1,), lora_seeds=())["base"]
        grid = [knobs]
        if a.sweep:
            grid = [
                replace(knobs, **dict(zip(SWEEP, combo, strict=True))) for combo in itertools.product(*SWEEP.values())
            ]
        for k in grid:
            result = evaluate(model_dir, k, a.seeds, verbose=a.verbose)
            if a.json:
                with a.json.open("a") as f:
                    f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

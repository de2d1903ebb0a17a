"""TRL's own `AsyncGRPOTrainer`, unchanged, training a LoRA policy through the fleet's one URL.

The trainer is TRL 1.16.0's (`trl.experimental.async_grpo`), built the way its docs build it:
a model path, a reward function, a prompt dataset, an `AsyncGRPOConfig` whose
`vllm_server_base_url` is the fleet's URL, and a PEFT `LoraConfig`. TRL probes the URL
(`GET /health`, `GET /server_info`, `GET /v1/models`), finds LoRA on, and syncs **adapters only**:
after each step it saves the adapter, pauses (`/pause?mode=keep`), loads it as
`trl-policy-v<N>` (`/v1/load_lora_adapter`), resumes, and unloads the one that fell out of its
staleness window; its rollout process asks `/v1/completions` for `trl-policy-v<N>`. The fleet
makes each of those calls reach every engine. What the run adds is around TRL, not in it: the CPU
stand-ins (`cpu`), the task's reward and the record of who served each rollout (`rollouts`), and
a line per step.

The task is the project's RL run's (`rlcp.rl.task`): the share of a completion's 16 tokens equal
to `!`, over the same eight prompts, as chat messages (TRL's rollout worker renders every prompt
through the chat template).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlcp.rl.task import PROMPT_TEXTS, make_task
from rlcp.rl.trl import cpu
from rlcp.rl.trl.rollouts import RolloutLog, TargetReward, tally

SERVED_NAME = "tiny"  # the name the fleet serves the base model under (rlcp.harness.tiny_model's)
LORA_NAME = "trl-policy"  # TRL's own: adapters load as trl-policy-v1, -v2, ...
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# How TRL reads an answer back into a chat message (`trl.chat_template_utils.parse_response`): a
# tokenizer attribute chat models ship (TRL adds it for the families it knows, `add_response_schema`).
# The tiny model's template (`rlcp.harness.tiny_model`) opens the answer with `<|assistant|>` and ends it
# at `</s>`. Without one, TRL's rollout process dies on its first answer (AttributeError).
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {"content": {"close_pattern": r"</s>\s*|$", "content": "text"}},
}


@dataclass
class TrlSettings:
    steps: int = 20
    lr: float = 3e-2
    seed: int = 0
    prompts_per_step: int = 4
    group: int = 16  # completions per prompt (TRL's num_generations)
    max_tokens: int = 16
    # TRL's `epsilon_high` (DAPO's clip-higher): the PPO ratio's upper bound is 1 + this, the lower
    # stays 1 - `epsilon` (0.2). TRL trains here on samples one policy version old (`max_staleness`
    # below): with the upper bound at 1.2, the previous update has already pushed the target token's
    # ratio past it, and the samples that would push it further are clipped out of the gradient.
    epsilon_high: float = 5.0
    lora_rank: int = 8
    # TRL's `max_staleness`: samples from the adapter before the current one are still trained on
    # (importance-weighted by the engine's logprobs); the engines need `max_loras >= max_staleness + 2`.
    # Not 0: TRL then unloads the previous adapter while its rollout process still has requests
    # naming it in flight, and those retry their 404 for minutes (30 x 3 attempts, up to 16 s apart).
    max_staleness: int = 1
    sync: bool = True  # False: the negative control (TRL's documented no-op weight transfer)


@dataclass
class TrlStep:
    step: int
    reward: float
    wall_s: float
    published: str | None  # the adapter TRL had published when the step was logged
    served: dict[str, int]  # adapter (the answer's `model`) -> rollouts answered since the last step
    workers: dict[str, int]  # X-RL-Worker -> rollouts
    staleness: float | None  # TRL's sample/staleness_mean
    dropped_stale: float | None  # TRL's sample/dropped_stale_total

    @property
    def membership(self) -> list[str]:
        """Membership changes in the step, which `rlcp.rl.report.plot_runs` marks on the plot: TRL's
        run makes none (the project's own elastic run does)."""
        return []

    def line(self, steps: int) -> str:
        served = " ".join(f"{k}={v}" for k, v in self.served.items()) or "-"
        workers = " ".join(f"{k}={v}" for k, v in self.workers.items()) or "-"
        return (
            f"step {self.step}/{steps}  reward {self.reward:.3f}  rollouts by adapter {served}  "
            f"by worker {workers}  published {self.published or '-'}  {self.wall_s:.0f}s"
        )


@dataclass
class TrlRun:
    steps: list[TrlStep]
    rollouts: list[dict[str, Any]]  # every /v1/completions answer TRL's rollout process got
    published: list[str]  # every adapter TRL loaded, in order
    stand_ins: tuple[str, ...]
    out_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        head, tail = self.steps[:3], self.steps[-3:]
        unpublished = [r for r in self.rollouts if r.get("answered") not in self.published]
        return {
            "reward_first3": sum(s.reward for s in head) / max(len(head), 1),
            "reward_last3": sum(s.reward for s in tail) / max(len(tail), 1),
            "rollouts": len(self.rollouts),
            "rollouts_not_published": len(unpublished),
            "rollouts_failed": sum(1 for r in self.rollouts if r.get("status") != 200),
            "workers": tally(self.rollouts, "worker"),
            "published": self.published,
            "wall_s": self.steps[-1].wall_s if self.steps else 0.0,
        }


class NoWeightSync:
    """TRL's `WeightTransferProtocol` doing nothing: the docs' way to turn trainer-side sync off
    ("Pass a no-op implementation to disable trainer-side weight sync"). The negative control."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def send_weights(self, iterator: Any) -> None:
        for _ in iterator:
            pass

    def resume(self) -> None: ...
    def destroy(self) -> None: ...


def train_with_trl(
    url: str, model_dir: Path, out_dir: Path, settings: TrlSettings, *, say: Callable[[str], None] = print
) -> TrlRun:
    """Run TRL's AsyncGRPOTrainer for `settings.steps` steps against the fleet at `url`.

    Changes the working directory to `out_dir`: TRL names the served model by the path it loaded
    the model from, and the fleet serves it as `tiny`, so the model is loaded through a link named
    `tiny` there (only the negative control's rollouts ask for the base model by that name)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    stand_ins = cpu.install(cuda=torch.cuda.is_available())
    out_dir.mkdir(parents=True, exist_ok=True)
    link = out_dir / SERVED_NAME
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(model_dir.resolve(), target_is_directory=True)
    os.chdir(out_dir)
    rollout_log = out_dir / "rollouts.jsonl"
    rollout_log.unlink(missing_ok=True)

    tokenizer = AutoTokenizer.from_pretrained(SERVED_NAME)
    tokenizer.response_template = RESPONSE_TEMPLATE
    target = make_task(str(model_dir)).target
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": text}] for text in PROMPT_TEXTS]})
    config = AsyncGRPOConfig(
        output_dir=str(out_dir / "trainer"),
        vllm_server_base_url=url,
        vllm_server_timeout=60,
        request_timeout=120,
        max_steps=settings.steps,
        learning_rate=settings.lr,
        seed=settings.seed,
        num_generations=settings.group,
        per_device_train_batch_size=settings.prompts_per_step * settings.group,
        gradient_accumulation_steps=1,
        token_budget=0,  # a fixed count of samples per step, as `per_device_train_batch_size` says
        max_completion_length=settings.max_tokens,
        max_staleness=settings.max_staleness,
        epsilon_high=settings.epsilon_high,
        # One step's samples waiting at most: TRL's rollout process otherwise keeps every engine busy
        # filling a 1024-sample queue whose older part is dropped as stale, and on two shared CPU
        # cores that generation slows the training it feeds.
        queue_maxsize=settings.prompts_per_step * settings.group,
        bf16=False,  # TRL's default is bf16 (GPU); float32 on both sides, as the engines serve
        dtype="float32",
        gradient_checkpointing=False,  # a model this small gains nothing from it
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,  # the run prints its own line per step
        use_cpu=not torch.cuda.is_available(),
    )
    peft = LoraConfig(
        r=settings.lora_rank, lora_alpha=2 * settings.lora_rank, lora_dropout=0.0, target_modules=LORA_TARGETS
    )
    steps: list[TrlStep] = []
    log = RolloutLog(rollout_log)
    t0 = time.monotonic()
    holder: dict[str, Any] = {}

    class StepReport(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if not logs or "reward" not in logs:
                return
            version = holder["trainer"].model_version if settings.sync else 0
            new = log.read_new()
            step = TrlStep(
                step=state.global_step,
                reward=float(logs["reward"]),
                wall_s=time.monotonic() - t0,
                published=f"{LORA_NAME}-v{version}" if version else None,
                served=tally(new, "answered"),
                workers=tally(new, "worker"),
                staleness=logs.get("sample/staleness_mean"),
                dropped_stale=logs.get("sample/dropped_stale_total"),
            )
            steps.append(step)
            say(step.line(settings.steps))

    trainer = AsyncGRPOTrainer(
        model=SERVED_NAME,
        reward_funcs=TargetReward(target, str(rollout_log)),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepReport()],
        peft_config=peft,
        weight_transfer=None if settings.sync else NoWeightSync(),
    )
    holder["trainer"] = trainer
    trainer.remove_callback(PrinterCallback)  # transformers' print of every log dict: the step line says it
    say(
        f"TRL {_version('trl')} AsyncGRPOTrainer at {url}: {settings.steps} steps of {settings.prompts_per_step} "
        f"prompts x {settings.group} completions x {settings.max_tokens} tokens, LoRA r={settings.lora_rank}, "
        f"lr {settings.lr:g}, PPO ratio clipped to [{1 - config.epsilon:g}, {1 + settings.epsilon_high:g}], "
        + (
            f"adapter-only sync ({LORA_NAME}-v<N>, max_staleness {settings.max_staleness})"
            if trainer._lora_sync
            else "weight sync OFF (the negative control)"
            if not settings.sync
            else "MERGED-weight sync (TRL did not choose adapter-only sync: see its warning above)"
        )
    )
    for name in stand_ins:
        say(f"  CPU stand-in: {name}")
    trainer.train()
    log.read_new()
    version = trainer.model_version if settings.sync else 0
    return TrlRun(
        steps=steps,
        rollouts=log.lines,
        published=[f"{LORA_NAME}-v{k}" for k in range(1, version + 1)] if settings.sync else [SERVED_NAME],
        stand_ins=stand_ins,
        out_dir=out_dir,
        extra={"lora_sync": bool(trainer._lora_sync)},
    )


def write_run(run: TrlRun, label: str) -> tuple[Path, Path | None]:
    """The steps as JSONL and the reward plot (`rlcp.rl.report`'s), in the run's directory."""
    import json

    from rlcp.rl.report import plot_runs

    log = run.out_dir / f"{label}.jsonl"
    log.write_text("".join(json.dumps(asdict(s), sort_keys=True) + "\n" for s in run.steps))
    try:
        plot: Path | None = plot_runs(
            {label: run.steps}, run.out_dir / f"{label}.png", "TRL AsyncGRPOTrainer through the fleet"
        )  # type: ignore[dict-item]
    except ImportError:
        plot = None
    return log, plot


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)

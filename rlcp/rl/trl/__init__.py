"""TRL's own trainers through the fleet: `python -m rlcp.rl.trl`.

TRL 1.16.0's `AsyncGRPOTrainer` (`trl.experimental.async_grpo`), unchanged, pointed at the fleet's
one URL, trains a LoRA policy on the tiny model with adapter-only sync (the `trl` extra).

- `run`: the trainer built as TRL's docs build it, a line per step, the run's record;
- `rollouts`: the task's reward, and which adapter and worker answered each rollout;
- `cpu`: the two stand-ins TRL needs on a machine without CUDA, and why each;
- `__main__`: the command.
"""

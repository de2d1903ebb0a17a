"""The engine's side of a held request (`rlcp.harness.hold` says what a hold is): a vLLM logits
processor, loaded through vLLM's own plug-in point (`--logits-processors`, the `logits_processors`
engine argument), that slows every step a held request takes part in while its hold file exists.

Logits pass through untouched, so greedy outputs are the same with or without a hold. It is not
argmax-invariant on purpose: vLLM applies only those on every step, greedy requests included.
An engine that does not load it ignores `extra_args`, and a hold then holds nothing; the tests
that hold a request check that it was still running.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from rlcp.harness.hold import KEY, STEP_S

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig


class HeldSteps(LogitsProcessor):  # type: ignore[misc]  # vLLM is not type-checked here (Any)
    """Slows each step with a held request in the batch while that request's hold file exists."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._held: dict[int, str] = {}  # batch index -> hold file

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        path = (sampling_params.extra_args or {}).get(KEY)
        if path is not None and not (isinstance(path, str) and os.path.isabs(path)):
            raise ValueError(f"extra_args.{KEY} must be an absolute path, not {path!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._held, batch_update, _hold_file)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._held and any(os.path.exists(path) for path in set(self._held.values())):
            time.sleep(STEP_S)
        return logits


def _hold_file(params: SamplingParams, _prompt: list[int] | None, _output: list[int]) -> str | None:
    path = (params.extra_args or {}).get(KEY)
    return path if isinstance(path, str) else None

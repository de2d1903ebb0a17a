"""A real engine held mid-request, so "a request is running when the pause arrives" is certain.

Tests of pause modes need a request still generating when the pause lands. On the 2-core CI
machine a 900-token request on the tiny model takes ~2 s when idle, and a test process whose
loop was held a few seconds saw it finished before it could pause it: the premise was likely,
not certain. `PacedSteps` is a vLLM logits processor (vLLM's own extension point, loaded in the
engine's worker by `--logits-processors rlcp.harness.pacing:PacedSteps`, or the engine argument
`logits_processors`) that makes each engine step take at least `STEP_S` while a request in the
batch names a gate file that exists (`vllm_xargs: {"rlcp_gate": "<path>"}` in the request, see
`gate_args`). The test creates the file, starts its requests, pauses them at its leisure (a
request of N tokens cannot end in less than N * STEP_S), and removes the file to let them run
at full speed. Requests that name no gate, and every request once the file is gone, are not
touched; the logits pass through unchanged, so tokens and logprobs are the engine's own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

if TYPE_CHECKING:
    from vllm.config import VllmConfig

GATE_ARG = "rlcp_gate"
STEP_S = 0.05  # 20 tokens a second at most while gated: 1,000 tokens take 50 s
PROCESSOR = "rlcp.harness.pacing:PacedSteps"


def gate_args(gate: Path) -> dict[str, Any]:
    """The request fields that put a request under `gate` (a file the test creates and removes)."""
    return {"vllm_xargs": {GATE_ARG: str(gate)}}


class PacedSteps(LogitsProcessor):  # type: ignore[misc]  # vLLM is not analysed here: its classes are Any
    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._gates: dict[int, str] = {}  # batch index -> gate file of the request there

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        return None

    def is_argmax_invariant(self) -> bool:
        # Not skipped for greedy requests: vLLM calls `apply` only on processors that say False.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._gates.pop(index, None)
        for index, params, _prompt, _output in batch_update.added:
            gate = (params.extra_args or {}).get(GATE_ARG) if params is not None else None
            if gate:
                self._gates[index] = str(gate)
            else:
                self._gates.pop(index, None)
        for a, b, direction in batch_update.moved:
            moved_a, moved_b = self._gates.pop(a, None), self._gates.pop(b, None)
            if moved_a is not None:
                self._gates[b] = moved_a
            if moved_b is not None and direction.name == "SWAP":
                self._gates[a] = moved_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if any(os.path.exists(gate) for gate in set(self._gates.values())):
            time.sleep(STEP_S)
        return logits

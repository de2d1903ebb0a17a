"""Requests a test can hold mid-way, the test's side: a hold file, and the request field that
names it. The engine's side is `rlcp.harness.held_steps` (a vLLM logits processor, imported only
by the engines that load it, so this module and its callers do not import vLLM).

A request is held when its sampling parameters carry `extra_args={"hold": PATH}` (over the
OpenAI API: `"vllm_xargs": {"hold": PATH}`; through Dynamo's frontend, whose OpenAI routes
refuse both, its `/inference/v1/generate` with `"sampling_params": {"extra_args": {"hold":
PATH}}`). While PATH exists, each engine step with a held request in the batch takes at least
`STEP_S` longer, so a held request of N tokens runs for at least N * STEP_S seconds however fast
the machine is; once the test removes PATH it runs at full speed again. This makes "the request
is still running when the pause lands" certain instead of likely (the tiny models decode
hundreds of tokens a second), unless the test itself stalls for longer than the whole held
request. The engine is slowed, never stopped: between two steps it still takes a pause, an abort
or an update, which is what those tests are about.
"""

from __future__ import annotations

from pathlib import Path

KEY = "hold"
STEP_S = 0.2  # a held request of 200 tokens runs for 40 s at least
FQCN = "rlcp.harness.held_steps:HeldSteps"
ENGINE_ARG = {"logits_processors": [FQCN]}  # the engine argument that loads it (an agent's extra_engine_args)
SERVE_ARGS = ["--logits-processors", FQCN]  # the same, for `vllm serve`


class Hold:
    """One hold file: `xargs` marks a request as held (its `vllm_xargs`); `release()` lets every
    request it holds run at full speed, as does leaving the `with` block."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> Hold:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def xargs(self) -> dict[str, str]:
        return {KEY: str(self.path)}

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

"""The reward TRL scores with, and the record of which adapter and worker served each rollout.

TRL's `AsyncGRPOTrainer` samples in a spawned child process (its `AsyncRolloutWorker`) on an aiohttp
session of its own, and keeps nothing of the answers but tokens and logprobs: which adapter served a
rollout, on which worker, is in the answers it throws away (the `model` of the body, the fleet's
`X-RL-Worker` and `X-RL-Weight-Version` headers). The reward function is the one object of ours TRL
carries into that process (it pickles `reward_funcs` for the spawn), so `TargetReward`, when unpickled
there, adds an aiohttp trace (aiohttp's own hook for observing a session's requests) to the sessions
the process opens. It reads what TRL sends and gets, and changes neither: one JSON line per
`/v1/completions` answer in `rollout_log` (the adapter asked for, the one that answered, the status,
the worker, the base weights' version).

The reward is the task of the project's own RL run (`rlcp.rl.task`): the share of a completion's
tokens equal to one target token.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_installed: list[str] = []  # the log this process's sessions write to (once per process)


class TargetReward:
    """TRL reward function: the share of each completion's tokens equal to `target`.

    Picklable (TRL spawns its rollout process with it); unpickled there with a `rollout_log`, it
    records every completion answer in that file (`record_rollouts`)."""

    __name__ = "target_share"  # TRL names the reward's metric after it

    def __init__(self, target: int, rollout_log: str | None = None) -> None:
        self.target = target
        self.rollout_log = rollout_log

    def __call__(self, completion_ids: list[list[int]], **_: Any) -> list[float]:
        return [sum(t == self.target for t in ids) / len(ids) if ids else 0.0 for ids in completion_ids]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.rollout_log:
            record_rollouts(self.rollout_log)


def record_rollouts(log_path: str) -> None:
    """Add a trace to every aiohttp session this process opens from now on: a line per
    `/v1/completions` answer in `log_path`."""
    import aiohttp

    if _installed:
        return
    _installed.append(log_path)

    async def on_start(session: Any, ctx: Any, params: Any) -> None:
        ctx.body, ctx.answer, ctx.line = b"", b"", None

    async def on_chunk_sent(session: Any, ctx: Any, params: Any) -> None:
        ctx.body += params.chunk

    async def on_end(session: Any, ctx: Any, params: Any) -> None:  # the answer's head is in
        if params.url.path.endswith("/v1/completions"):
            ctx.line = {
                "t": time.time(),
                "asked": _json_field(ctx.body, "model"),
                "status": params.response.status,
                "worker": params.response.headers.get("X-RL-Worker"),
                "weight_version": params.response.headers.get("X-RL-Weight-Version"),
            }

    async def on_chunk_received(session: Any, ctx: Any, params: Any) -> None:  # TRL reads the body
        if ctx.line is None:
            return
        ctx.answer += params.chunk
        try:
            answer = json.loads(ctx.answer)
        except ValueError:
            return  # more to come
        ctx.line["answered"] = answer.get("model") if isinstance(answer, dict) else None
        with open(log_path, "a") as f:
            f.write(json.dumps(ctx.line) + "\n")
        ctx.line = None

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    trace.on_request_chunk_sent.append(on_chunk_sent)
    trace.on_request_end.append(on_end)
    trace.on_response_chunk_received.append(on_chunk_received)
    original = aiohttp.ClientSession.__init__

    def traced_init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or []), trace]
        original(self, *args, **kwargs)

    aiohttp.ClientSession.__init__ = traced_init  # type: ignore[method-assign]


def _json_field(body: bytes, key: str) -> Any:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value.get(key) if isinstance(value, dict) else None


@dataclass
class RolloutLog:
    """Reads the rollout log as it grows: what was served since the last read."""

    path: Path
    offset: int = 0
    lines: list[dict[str, Any]] = field(default_factory=list)

    def read_new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open() as f:
            f.seek(self.offset)
            text = f.read()
        complete = text[: text.rfind("\n") + 1]
        self.offset += len(complete.encode())
        new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        self.lines += new
        return new


def tally(lines: list[dict[str, Any]], key: str) -> dict[str, int]:
    """How many lines carry each value of `key`, in first-seen order."""
    return dict(Counter(str(line.get(key)) for line in lines))

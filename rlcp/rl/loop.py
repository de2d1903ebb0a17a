"""The run: sample through the fleet, train, push the weights to every engine, check them.

Synchronous (staleness 0): each step samples on the weights just pushed, trains, and pushes
the next version before sampling again. Asynchronous (`mode="async"`): step k+1's rollouts
are sampled while the trainer trains on step k and pushes it, so they may straddle an
update; each token's version comes from the answer's spans, tokens from weights more than
`staleness` versions behind the trainer are left out of the loss, and the rest are weighted
by the importance ratio against the engine's logprobs (the behaviour policy).

After every push the trainer checks that the engines sample with its weights: each sampled
token's engine logprob against its own logprob under the weights of the version that
sampled it (the weights it pushed as that version; it keeps the last few). On CPU, float32
on both sides, the two differ by rounding only (kernel order); a mismatch past the
tolerance is a sync bug (a tensor not loaded, a stale shard, the wrong dtype).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rlcp.rl.policy import clipped_pg_loss, group_advantages, token_logprobs
from rlcp.rl.sampling import Completion, Sampler
from rlcp.rl.sync import WeightSync
from rlcp.rl.task import TargetTokenTask


def step_version(k: int) -> str:
    """The weight version the run pushes after step `k`."""
    return f"step-{k}"


def step_of(version: str) -> int:
    """The step whose push `version` is (`step_version`'s inverse)."""
    return int(version.removeprefix("step-"))


Mode = Literal["sync", "async"]
# |engine logprob - trainer logprob| per token, float32 on both sides: the engines' CPU kernels
# sum in another order than torch's, which moves a logprob by ~1e-5 at most on this model; a
# tensor left unloaded moves it by whole units. Held per token, for the largest one.
MISMATCH_TOLERANCE = 1e-3


@dataclass(frozen=True)
class RunSettings:
    steps: int = 20
    prompts_per_step: int = 4
    group: int = 8  # completions per prompt (GRPO's group)
    max_tokens: int = 16
    lr: float = 1e-2  # Adam
    seed: int = 0
    mode: Mode = "sync"
    staleness: int = 1  # async: tokens this many versions behind the trainer still count
    push: bool = True  # False: the negative control (the engines keep their first weights)
    drop_stale: bool = True  # False: every token counts, whatever weights sampled it (a hand-rolled trainer)


@dataclass
class StepRecord:
    """One step, as the step line, the JSONL log and the plots show it."""

    step: int
    reward: float  # mean over the step's completions
    pushed: str | None  # the version pushed after this step (None: no push)
    sync_error: str | None
    mismatch_mean: float | None  # |engine - trainer| logprob over the compared tokens
    mismatch_max: float | None
    compared: int  # tokens compared (those whose version the trainer holds weights of)
    versions: dict[str, int]  # tokens by the version that sampled them
    off_policy: int  # tokens sampled by weights older than the trainer's
    dropped: int  # tokens past the staleness bound, left out of the loss
    workers: dict[str, int]  # completions by the member that answered
    sample_s: float  # waiting for rollouts (async: only what training did not hide)
    train_s: float
    sync_s: float
    wall_s: float  # since the run started
    foreign: int = 0  # tokens from weights the trainer never pushed (left out of the loss unless drop_stale=False)
    # The largest |engine - trainer| logprob per member that answered (a joiner's included).
    mismatch_by_worker: dict[str, float] = field(default_factory=dict)
    membership: list[str] = field(default_factory=list)  # membership changes that landed during the step
    reforms: int = 0  # groups the push formed again for membership changes (`Pushed.reformed_for`)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Snapshots:
    """The trainer's weights of the last few versions it pushed, to score old tokens with."""

    keep: int
    order: list[str | None] = field(default_factory=list)
    weights: dict[str | None, dict[str, Any]] = field(default_factory=dict)

    def add(self, version: str | None, model: Any) -> None:
        self.order.append(version)
        self.weights[version] = {n: p.detach().clone() for n, p in model.named_parameters()}
        for old in self.order[: -self.keep]:
            self.weights.pop(old, None)

    def behind(self, version: str | None) -> int | None:
        """How many versions `version` is behind the newest; None when never pushed here."""
        if version not in self.order:
            return None
        return len(self.order) - 1 - self.order.index(version)


def compare(
    model: Any,
    batch: Sequence[Completion],
    current: Sequence[Any],
    snapshots: Snapshots,
    by_worker: dict[str, float] | None = None,
) -> tuple[list[float], int, int]:
    """(|Δ logprob| of every token whose version's weights the trainer holds, tokens older than
    the newest version, tokens of a version it does not know). `by_worker`, when given, gets the
    largest |Δ logprob| of each member that answered."""
    import torch

    diffs: list[float] = []
    older = unknown = 0
    newest = snapshots.order[-1]
    by_version = Counter(v for c in batch for v in c.versions)
    for version in by_version:
        if version == newest or version is None:
            scored = [lp.detach() for lp in current]
        elif version in snapshots.weights:
            with torch.no_grad():
                scored = token_logprobs(
                    model, [c.prompt for c in batch], [c.tokens for c in batch], weights=snapshots.weights[version]
                )
        else:
            unknown += by_version[version]
            continue
        if version != newest and version is not None:
            older += by_version[version]
        for c, lp in zip(batch, scored, strict=True):
            mine = [abs(float(lp[i]) - c.logprobs[i]) for i, v in enumerate(c.versions) if v == version]
            diffs += mine
            if by_worker is not None and mine:
                w = str(c.worker)
                by_worker[w] = max(by_worker.get(w, 0.0), *mine)
    return diffs, older, unknown


@dataclass
class Trainer:
    """The model, its optimizer, and the run's loop over the fleet."""

    model: Any
    task: TargetTokenTask
    sampler: Sampler
    sync: WeightSync
    settings: RunSettings
    initial_version: str | None  # the version the engines serve the trainer's starting weights as
    on_step: Callable[[StepRecord], None] = lambda record: None
    # Awaited after `on_step`, before the next step samples: None for a run that never waits (a test
    # holds the run here until a change it made has landed, so the steps after it show the change).
    between_steps: Callable[[StepRecord], Awaitable[None]] | None = None
    # The membership changes that landed since the last call (a local fleet's churn), for the record.
    membership: Callable[[], list[str]] = lambda: []

    def __post_init__(self) -> None:
        import torch

        torch.manual_seed(self.settings.seed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.settings.lr)
        self.snapshots = Snapshots(keep=self.settings.staleness + 1)
        self.snapshots.add(self.initial_version, self.model)

    async def run(self) -> list[StepRecord]:
        s, t0, records = self.settings, time.monotonic(), []
        pending: asyncio.Task[list[Completion]] | None = None
        try:
            for k in range(1, s.steps + 1):
                t = time.monotonic()
                if pending is None:
                    batch = await self._sample(k)
                else:
                    batch = await pending
                    pending = None
                if s.mode == "async" and k < s.steps:  # the next step samples while this one trains
                    pending = asyncio.create_task(self._sample(k + 1), name=f"sample-step-{k + 1}")
                sample_s = time.monotonic() - t
                t = time.monotonic()
                stats = await asyncio.to_thread(self._train, batch)
                train_s = time.monotonic() - t
                pushed = await self.sync.push(self.model, step_version(k)) if s.push else None
                if pushed is not None:
                    # Even a failed push names these weights: a member that took them before the
                    # failure serves them under this version, and its tokens are checked against them.
                    self.snapshots.add(pushed.version, self.model)
                record = StepRecord(
                    step=k,
                    **stats,
                    pushed=pushed.version if pushed else None,
                    sync_error=pushed.error if pushed else None,
                    sample_s=sample_s,
                    train_s=train_s,
                    sync_s=pushed.seconds if pushed else 0.0,
                    wall_s=time.monotonic() - t0,
                    membership=self.membership(),
                    reforms=len(pushed.reformed_for) if pushed else 0,
                )
                records.append(record)
                self.on_step(record)
                if self.between_steps is not None:
                    await self.between_steps(record)
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
        return records

    async def _sample(self, k: int) -> list[Completion]:
        s = self.settings
        return await self.sampler.sample(self.task.prompts_for(k, s.prompts_per_step), s.group, s.seed * 100_000 + k)

    def _train(self, batch: Sequence[Completion]) -> dict[str, Any]:
        """One optimizer step on `batch`; the step's figures."""
        rewards = [self.task.reward(c.tokens) for c in batch]
        current = token_logprobs(self.model, [c.prompt for c in batch], [c.tokens for c in batch])
        by_worker: dict[str, float] = {}
        diffs, older, foreign = compare(self.model, batch, current, self.snapshots, by_worker)
        keep = [[self.counts_in_loss(v) for v in c.versions] for c in batch]
        loss = clipped_pg_loss(
            current, [c.logprobs for c in batch], group_advantages(rewards, self.settings.group), keep
        )
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {
            "reward": sum(rewards) / len(rewards),
            "mismatch_mean": sum(diffs) / len(diffs) if diffs else None,
            "mismatch_max": max(diffs) if diffs else None,
            "compared": len(diffs),
            "versions": dict(Counter(str(v) for c in batch for v in c.versions)),
            "off_policy": older,
            "foreign": foreign,
            "dropped": sum(not k for ks in keep for k in ks),
            "workers": dict(Counter(str(c.worker) for c in batch)),
            "mismatch_by_worker": by_worker,
        }

    def counts_in_loss(self, version: str | None) -> bool:
        """Whether a token of `version` goes into the loss: within the staleness bound of the
        trainer's newest push. A version the trainer never pushed (an engine restarted on other
        weights) does not; a token no answer names a version for does (a fleet that names none is
        trusted, as a hand-rolled trainer trusts it)."""
        if not self.settings.drop_stale or version is None:
            return True
        behind = self.snapshots.behind(version)
        return behind is not None and behind <= (self.settings.staleness if self.settings.mode == "async" else 0)

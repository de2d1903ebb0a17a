"""One RL run over a running fleet: the pieces of `rlcp.rl` put together.

`train_through_fleet` is what `python -m rlcp.rl` and the local fleet (`bash
scripts/run-local.sh`) call: the trainer's model from the directory the engines loaded,
rollouts through the gateway, weights to every engine through the controller, a line per
step, and the JSONL log and plot in `out_dir`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import aiohttp

from rlcp.client.client import ControlPlaneClient
from rlcp.rl.loop import RunSettings, StepRecord, Trainer, step_of
from rlcp.rl.policy import load_policy
from rlcp.rl.report import plot_runs, step_line, write_jsonl
from rlcp.rl.sampling import Sampler
from rlcp.rl.sync import BroadcastSync, DiskSync, SyncKind, WeightSync
from rlcp.rl.task import make_task


@dataclass(frozen=True)
class Fleet:
    """Where the run finds the fleet."""

    controller: str  # the controller's API URL
    gateway: str  # the fleet's inference endpoint
    token: str | None  # the API token (the gateway takes the same one)
    model: str = "tiny"  # the served model name


@dataclass(frozen=True)
class RunOutput:
    records: list[StepRecord]
    log: Path
    plot: Path | None


async def train_through_fleet(
    fleet: Fleet,
    model_dir: Path,
    out_dir: Path,
    settings: RunSettings,
    *,
    sync: SyncKind = "broadcast",
    backend: Literal["gloo", "nccl"] = "gloo",
    device: str = "cpu",
    label: str = "rlcp",
    say: Callable[[str], None] = print,
    on_step: Callable[[StepRecord], None] | None = None,
    membership: Callable[[], list[str]] | None = None,
    between_steps: Callable[[StepRecord], Awaitable[None]] | None = None,
    round_started: Callable[[int], None] | None = None,
) -> RunOutput:
    """Train `settings.steps` steps through `fleet`; the records, and where the log and plot are.
    `on_step` is told each step after its line is said (a local fleet applies its churn there);
    `membership` names the membership changes that landed since it was last called;
    `between_steps` is awaited after each step (`Trainer.between_steps`); `round_started` is told the
    step once its broadcast's round is open, in the trainer's thread (`BroadcastSync.round_started`)."""

    def stepped(r: StepRecord) -> None:
        say(step_line(r, settings.steps))
        if on_step is not None:
            on_step(r)

    async with ControlPlaneClient(fleet.controller, token=fleet.token, timeout_s=30) as client:
        state = await client.state()
        initial = state.applied.weight_version or state.desired.weight_version
        # Asynchronous: the gateway may serve the last version while the next one rolls in.
        await client.set_staleness(settings.staleness if settings.mode == "async" else 0)
        pusher: WeightSync
        if sync == "broadcast":
            pusher = BroadcastSync(
                fleet.controller,
                fleet.token,
                out_dir / "steps",
                backend=backend,
                round_started=None if round_started is None else (lambda v: round_started(step_of(v))),
            )
        else:
            pusher = DiskSync(client, out_dir / "steps", max_unavailable=1 if settings.mode == "async" else None)
        headers = {"Authorization": f"Bearer {fleet.token}"} if fleet.token else {}
        async with aiohttp.ClientSession() as session:
            sampler = Sampler(session, [fleet.gateway], fleet.model, settings.max_tokens, headers=headers)
            trainer = Trainer(
                load_policy(str(model_dir), device),
                make_task(str(model_dir)),
                sampler,
                pusher,
                settings,
                initial,
                on_step=stepped,
                membership=membership or (lambda: []),
                between_steps=between_steps,
            )
            say(
                f"training: {settings.steps} steps of {settings.prompts_per_step} prompts x {settings.group} "
                f"completions x {settings.max_tokens} tokens, {settings.mode}, weights by {sync}"
                + ("" if settings.push else " (push DISABLED: the negative control)")
                + f"; the fleet serves {initial}; the gateway's staleness bound is set to "
                + f"{settings.staleness if settings.mode == 'async' else 0}"
            )
            try:
                records = await trainer.run()
            finally:
                await pusher.close()
    log = write_jsonl(records, out_dir / f"{label}.jsonl")
    try:
        plot: Path | None = plot_runs({label: records}, out_dir / f"{label}.png")
    except ImportError:
        plot = None  # matplotlib is in the bench/dev extras; the log has every figure
    return RunOutput(records, log, plot)

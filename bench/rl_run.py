"""`python -m bench.rl_run`: the same GRPO run three ways over the same two vLLM CPU agents.

Issue 32, item 4: what a team writes by hand against what this project gives it, on the run
the project exists for. `rlcp.rl`'s trainer (`rlcp.rl.loop.Trainer`: the same model, task,
seeds, steps and learning rate in every configuration) samples tokens-in/tokens-out, trains
in torch and pushes its weights after every step, over two real agents (`python -m
rlcp.agent`, one vLLM CPU engine each, the tiny Llama), started once:

- **hand-rolled**: what trainers do without a control plane (prime-rl's
  `src/prime_rl/utils/client.py`): per step an `asyncio.gather` over the agents of a
  keep-mode pause (`POST /pause?mode=keep`), then of the disk load (the agent's
  `POST /v1/agent/weights/disk`), then of the resume, straight to each admin port with the
  agents' token, transient failures retried with back-off; rollouts round-robin straight to
  the agents' inference ports; no fence, and every token counts (`drop_stale=False`).
- **rlcp sync**: the controller over the same agents, with its gateway; rollouts through the
  gateway, one `update_weights` call per step (`rlcp.rl.sync.DiskSync`), staleness 0.
- **rlcp async**: the same, with step k+1 sampled while step k trains and pushes, rolling
  updates one agent at a time, staleness bound 1.

All three move the weights from disk (save, then the agents' disk load), so they are
compared on the same transport; broadcast has a benchmark of its own (section 3 of
docs/performance.md). Before each configuration both agents go back to the base weights (a
disk load of the base model under a fresh version name).

Per configuration, all from the same run: median seconds per step; time to a reward
threshold (the first step whose reward reaches it: its number, and the wall-clock at its
end); the sync share (seconds the trainer waited on pushes ÷ the run's seconds); the largest
|Δ logprob| between engines and trainer (`StepRecord.mismatch_max`); ratios to hand-rolled.

Then the kill case (`--kill-step`, 0 = none): the three again, one agent SIGKILLed when that
step's sampling begins and started again on its base weights at the same ports; the
sampling waits until its process serves again (the same wait in every configuration, so the
restarted agent is there to be reached). Counted: rollouts (completions) from the wrong
weights, read off each completion's per-token versions (the engine's own spans,
`Completion.versions`): a completion with any token sampled by a version other than the
trainer's when the step's sampling began (the version it had pushed last, or begun to push);
async, also the one before it (staleness 1) and any pushed while the sampling ran.

The rlcp configurations are put together here from the pieces `rlcp.rl.run.train_through_fleet`
uses (policy, task, a `Sampler` on the gateway, `DiskSync` with `max_unavailable=1` when
async, the gateway's staleness bound): the bench needs each step's completions and a hook at
the start of a step's sampling, which that function does not take. A `Sampler` subclass
(`RecordingSampler`) gives both, in all three configurations alike.

    python -m bench.rl_run                          # 16 steps, lr 1e-2, the kill case at step 4
    python -m bench.rl_run --steps 8 --kill-step 0  # the three configurations only
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import controller_daemon, ensure_matplotlib, quiet_logs, report, table
from rlcp.client.client import ControlPlaneClient
from rlcp.harness.processes import AgentProcess, stop_all
from rlcp.harness.tiny_model import SERVED_NAME
from rlcp.rl.loop import RunSettings, StepRecord, Trainer
from rlcp.rl.sampling import Completion, Sampler
from rlcp.rl.sync import DiskSync, Pushed, WeightSync, save_weights

CONFIGS = ("hand-rolled", "rlcp sync", "rlcp async")
say = functools.partial(print, flush=True)


class BenchError(Exception):
    """The fleet could not be set up or reset; the message says which part and why."""


# -- the hand-rolled baseline ------------------------------------------------------------
@dataclass
class HandRolledSync:
    """prime-rl's client, on our agents: pause every agent (keep), load every agent, resume
    every agent, each phase one `asyncio.gather`, the resume in a `finally`. A call that fails
    in transport or with a 5xx is sent again after 1, 2, 4, 8 s (prime-rl: exponential back-off
    from 1 s up to 10 s); a 4xx is final. No verification, no view of which agent holds what."""

    session: aiohttp.ClientSession
    admin_urls: Sequence[str]
    token: str
    steps_dir: Path
    attempts: int = 5
    pause_timeout_s: float = 60.0
    load_timeout_s: float = 300.0

    async def push(self, model: Any, version: str) -> Pushed:
        t0 = time.monotonic()
        path = await asyncio.to_thread(save_weights, model, self.steps_dir / version)
        try:
            await self._each("/pause", params={"mode": "keep", "clear_cache": "false"}, timeout_s=self.pause_timeout_s)
            try:
                await self._each(
                    "/v1/agent/weights/disk",
                    body={"path": str(path), "version": version},
                    timeout_s=self.load_timeout_s,
                )
            finally:
                await self._each("/resume", timeout_s=self.pause_timeout_s)
        except BenchError as exc:
            return Pushed(version, time.monotonic() - t0, str(exc))
        return Pushed(version, time.monotonic() - t0)

    async def _each(
        self, path: str, *, timeout_s: float, params: dict[str, str] | None = None, body: dict[str, Any] | None = None
    ) -> None:
        await asyncio.gather(*(self._post(url, path, params, body, timeout_s) for url in self.admin_urls))

    async def _post(
        self, url: str, path: str, params: dict[str, str] | None, body: dict[str, Any] | None, timeout_s: float
    ) -> None:
        reason = "no attempt"
        for attempt in range(self.attempts):
            try:
                async with self.session.post(
                    url + path,
                    params=params,
                    json=body,
                    headers={"Authorization": f"Bearer {self.token}"},
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                ) as resp:
                    text = await resp.text()
                    if resp.status < 300:
                        return
                    reason = f"HTTP {resp.status}: {text[:300]}"
                    if resp.status < 500:
                        break  # prime-rl retries 5xx and transport errors only
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.attempts:
                await asyncio.sleep(min(10.0, 2.0**attempt))
        raise BenchError(f"POST {url}{path} failed: {reason}")

    async def close(self) -> None:
        pass


# -- what every configuration records ------------------------------------------------------
@dataclass
class PushLog:
    """A `WeightSync` that notes each version as its push begins (the trainer's weights carry
    that name from then on), then hands the push on."""

    inner: WeightSync
    versions: list[str]  # the initial version, then each pushed one, in order

    async def push(self, model: Any, version: str) -> Pushed:
        self.versions.append(version)
        return await self.inner.push(model, version)

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Batch:
    """One step's completions, and the versions whose tokens count as the trainer's weights."""

    step: int
    completions: list[Completion]
    admitted: list[str]


@dataclass
class RecordingSampler(Sampler):
    """The trainer's sampler, keeping each step's completions; `before(k)` runs before step k
    samples (the kill case). The trainer asks for steps in order, one call each."""

    pushed: list[str] = field(default_factory=list)  # shared with the run's PushLog
    staleness: int = 0  # versions before the last pushed that still count (async: 1)
    before: Callable[[int], Awaitable[None]] | None = None
    batches: list[Batch] = field(default_factory=list)
    calls: int = 0

    async def sample(self, prompts: Sequence[tuple[int, ...]], group: int, seed: int) -> list[Completion]:
        self.calls += 1
        step = self.calls
        if self.before is not None:
            await self.before(step)
        last = len(self.pushed) - 1
        out = await super().sample(prompts, group, seed)
        # Read after the sampling: versions whose push began meanwhile count too (async).
        self.batches.append(Batch(step, out, self.pushed[max(0, last - self.staleness) :]))
        return out


def wrong_weights(batches: Sequence[Batch], pushed: Sequence[str]) -> dict[str, Any]:
    """Rollouts (completions) with a token from weights other than the trainer's (see the
    module docstring), per step and in all; and tokens from weights the trainer never pushed
    (it cannot score them against its own)."""
    known = set(pushed)
    per_step = {}
    rollouts = wrong = tokens = wrong_tokens = foreign = 0
    for b in batches:
        bad = [c for c in b.completions if any(v not in b.admitted for v in c.versions)]
        per_step[b.step] = len(bad)
        rollouts += len(b.completions)
        wrong += len(bad)
        tokens += sum(len(c.versions) for c in b.completions)
        wrong_tokens += sum(v not in b.admitted for c in b.completions for v in c.versions)
        foreign += sum(v not in known for c in b.completions for v in c.versions)
    return {
        "rollouts": rollouts,
        "wrong_rollouts": wrong,
        "tokens": tokens,
        "wrong_tokens": wrong_tokens,
        "never_pushed_tokens": foreign,
        "wrong_by_step": {k: n for k, n in per_step.items() if n},
    }


def figures(records: Sequence[StepRecord], threshold: float) -> dict[str, Any]:
    """What the table shows of one run."""
    walls = [r.wall_s for r in records]
    steps_s = [b - a for a, b in zip([0.0, *walls], walls, strict=False)]
    hit = next((r for r in records if r.reward >= threshold), None)
    mismatches = [r.mismatch_max for r in records if r.mismatch_max is not None]
    tail = records[-3:]
    return {
        "median_step_s": statistics.median(steps_s),
        "total_s": walls[-1],
        "median_sample_s": statistics.median(r.sample_s for r in records),
        "median_train_s": statistics.median(r.train_s for r in records),
        "median_sync_s": statistics.median(r.sync_s for r in records),
        "sync_share": sum(r.sync_s for r in records) / walls[-1],
        "threshold_step": hit.step if hit else None,
        "threshold_s": hit.wall_s if hit else None,
        "mismatch_max": max(mismatches) if mismatches else None,
        "reward_first": records[0].reward,
        "reward_last3": sum(r.reward for r in tail) / len(tail),
        "failed_pushes": [r.step for r in records if r.sync_error],
        "dropped_tokens": sum(r.dropped for r in records),
    }


def with_ratios(runs: dict[str, dict[str, Any]]) -> None:
    """Each run's step time and time to threshold ÷ hand-rolled's, in place."""
    base = runs.get("hand-rolled", {}).get("figures")
    for run in runs.values():
        f = run["figures"]
        f["step_ratio"] = f["median_step_s"] / base["median_step_s"] if base else None
        f["threshold_ratio"] = (
            f["threshold_s"] / base["threshold_s"] if base and f["threshold_s"] and base["threshold_s"] else None
        )


# -- the fleet: two agents, set back to the base weights before each run -----------------------
@dataclass
class Fleet:
    agents: list[AgentProcess]
    token: str  # the agents' admin token
    root: Path  # every path the agents and controllers may load from is under it
    base: Path  # the tiny model (tokenizer and base weights)


def make_fleet(root: Path, base: Path, count: int = 2) -> Fleet:
    """The agents, not started yet (`start_agents`)."""
    from rlcp.localfleet.start import vllm_engine

    token = secrets.token_urlsafe(16)
    agents = [
        AgentProcess(
            {
                "agent_id": f"agent-{i}",
                "engine": vllm_engine(base),
                "allowed_roots": [str(root)],
                "require_desired_version": True,
                "log_format": "json",
            },
            root / "agents",
            name=f"agent-{i}",
            token=token,
            start_timeout_s=300,
            # one core each (vLLM's CPU backend binds every engine to the same cores)
            env={"VLLM_CPU_OMP_THREADS_BIND": str(i % (os.cpu_count() or 1))},
        )
        for i in range(count)
    ]
    return Fleet(agents, token, root, base)


async def start_agents(fleet: Fleet) -> None:
    for a in fleet.agents:
        a.spawn()
    await asyncio.gather(*(a.wait_ready_async() for a in fleet.agents))
    for a in fleet.agents:  # a restart comes back at the same addresses
        a.config = {
            **a.config,
            "admin": {"port": a.ports["admin_port"], "token": fleet.token},
            "inference": {"port": a.ports["inference_port"]},
        }


async def warm_up(session: aiohttp.ClientSession, fleet: Fleet) -> None:
    """One step's sampling on each agent before any run: a fresh engine's first requests are
    slower, and the first configuration alone would pay for them."""
    from rlcp.rl.task import make_task

    prompts = make_task(str(fleet.base)).prompts_for(1, RunSettings.prompts_per_step)
    for a in fleet.agents:
        await Sampler(session, [a.inference_url], SERVED_NAME, RunSettings.max_tokens).sample(
            prompts, RunSettings.group, seed=1
        )


async def admin(
    session: aiohttp.ClientSession,
    agent: AgentProcess,
    method: str,
    path: str,
    body: Any = None,
    timeout_s: float = 120.0,
) -> Any:
    try:
        async with session.request(
            method,
            agent.admin_url + path,
            json=body,
            headers=agent.auth,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            data = await resp.json(content_type=None)
            if resp.status >= 300:
                raise BenchError(f"{method} {agent.name}{path}: HTTP {resp.status} {str(data)[:300]}")
            return data
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise BenchError(f"{method} {agent.name}{path}: {type(exc).__name__}: {exc}") from exc


async def reset_direct(session: aiohttp.ClientSession, fleet: Fleet, version: str) -> None:
    """Both agents on the base weights as `version`, running, told no desired version (a
    controller of an earlier run may have named one)."""
    for a in fleet.agents:
        await admin(session, a, "POST", "/resume")
        await admin(session, a, "PUT", "/v1/agent/desired", {"weight_version": None})
        await admin(session, a, "POST", "/v1/agent/weights/disk", {"path": str(fleet.base), "version": version})


@dataclass
class Kill:
    """SIGKILL one agent when step `step` begins to sample, and start it again on its base
    weights at the same ports; the sampling goes on once its process serves."""

    agent: AgentProcess
    step: int
    restart_s: float | None = None

    async def __call__(self, step: int) -> None:
        if step != self.step:
            return
        t0 = time.monotonic()
        self.agent.kill()
        self.agent.spawn()
        await self.agent.wait_ready_async()
        self.restart_s = time.monotonic() - t0
        say(f"  {self.agent.name} SIGKILLed at step {step}, serving again (base weights) after {self.restart_s:.1f}s")


# -- one run --------------------------------------------------------------------------------
async def train(
    label: str, settings: RunSettings, sampler: RecordingSampler, pushes: PushLog, base: Path
) -> list[StepRecord]:
    from rlcp.rl.policy import load_policy
    from rlcp.rl.report import step_line
    from rlcp.rl.task import make_task

    trainer = Trainer(
        load_policy(str(base)),
        make_task(str(base)),
        sampler,
        pushes,
        settings,
        pushes.versions[0],
        on_step=lambda r: say(f"  [{label}] {step_line(r, settings.steps)}"),
    )
    try:
        return await trainer.run()
    finally:
        await pushes.close()


async def run_hand_rolled(
    session: aiohttp.ClientSession, fleet: Fleet, a: argparse.Namespace, tag: str, kill: Kill | None
) -> dict[str, Any]:
    initial = f"base-{tag}"
    await reset_direct(session, fleet, initial)
    settings = RunSettings(steps=a.steps, lr=a.lr, seed=a.seed, mode="sync", drop_stale=False)
    pushes = PushLog(
        HandRolledSync(session, [p.admin_url for p in fleet.agents], fleet.token, fleet.root / tag / "steps"), [initial]
    )
    sampler = RecordingSampler(
        session,
        [p.inference_url for p in fleet.agents],
        SERVED_NAME,
        settings.max_tokens,
        pushed=pushes.versions,
        before=kill,
    )
    records = await train("hand-rolled", settings, sampler, pushes, fleet.base)
    return outcome(records, sampler, pushes, a.threshold, kill)


async def run_rlcp(
    session: aiohttp.ClientSession, fleet: Fleet, a: argparse.Namespace, tag: str, mode: str, kill: Kill | None
) -> dict[str, Any]:
    api_token = secrets.token_urlsafe(16)
    controller = controller_daemon(
        [p.spec(p.name) for p in fleet.agents],
        fleet.root / tag,
        name=f"controller-{tag}",
        api={"token": api_token},
        gateway={"enabled": True, "host": "127.0.0.1", "port": 0},
        workers={"token": fleet.token, "timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 300},
        reconcile={"poll_interval_s": 0.5, "interval_s": 0.5, "backoff_initial_s": 0.5, "backoff_max_s": 10},
        allowed_roots=[str(fleet.root)],
    )
    try:
        controller.spawn()
        await controller.wait_ready_async()
        async with ControlPlaneClient(controller.url, token=api_token, timeout_s=30) as client:
            await wait_reachable(client, len(fleet.agents))
            initial = f"base-{tag}"  # the reset, through the controller: its fence then names the base weights
            await client.update_weights(initial, str(fleet.base), timeout_s=300)
            gateway = ((await client.state_raw()).get("gateway") or {}).get("url")
            if not gateway:
                raise BenchError("the controller runs no gateway")
            settings = RunSettings(steps=a.steps, lr=a.lr, seed=a.seed, mode="async" if mode == "async" else "sync")
            await client.set_staleness(settings.staleness if settings.mode == "async" else 0)
            pushes = PushLog(
                DiskSync(client, fleet.root / tag / "steps", max_unavailable=1 if settings.mode == "async" else None),
                [initial],
            )
            sampler = RecordingSampler(
                session,
                [gateway],
                SERVED_NAME,
                settings.max_tokens,
                headers={"Authorization": f"Bearer {api_token}"},
                pushed=pushes.versions,
                staleness=settings.staleness if settings.mode == "async" else 0,
                before=kill,
            )
            records = await train(f"rlcp {mode}", settings, sampler, pushes, fleet.base)
            return outcome(records, sampler, pushes, a.threshold, kill)
    finally:
        controller.stop()


async def wait_reachable(client: ControlPlaneClient, workers: int, deadline_s: float = 120.0) -> None:
    deadline, state = time.monotonic() + deadline_s, {}
    while time.monotonic() < deadline:
        state = await client.state_raw()
        members = state.get("workers", [])
        if len(members) == workers and all(w["reachable"] for w in members):
            return
        await asyncio.sleep(0.25)
    raise BenchError(f"the controller did not reach {workers} workers in {deadline_s:g}s: {str(state)[:1000]}")


def outcome(
    records: list[StepRecord], sampler: RecordingSampler, pushes: PushLog, threshold: float, kill: Kill | None
) -> dict[str, Any]:
    return {
        "figures": figures(records, threshold),
        "wrong": wrong_weights(sampler.batches, pushes.versions),
        "sampler_retries": sampler.failed,
        "restart_s": kill.restart_s if kill else None,
        "records": [r.as_json() for r in records],
    }


async def measure(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from rlcp.harness.tiny_model import make_model_family

    hf_logging.disable_progress_bar()  # a bar per model made or loaded would bury the step lines
    base = make_model_family(root / "models")["base"]
    say(f"bench.rl_run: starting 2 vLLM agents (~1 min); work in {root}")
    t0 = time.monotonic()
    fleet = make_fleet(root, base)
    cases = {"no_kill": None} | ({"kill": a.kill_step} if a.kill_step else {})
    result: dict[str, Any] = {"cases": {}}
    try:
        await start_agents(fleet)
        say(f"bench.rl_run: agents up after {time.monotonic() - t0:.0f}s")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await warm_up(session, fleet)
            for case, kill_step in cases.items():
                runs: dict[str, dict[str, Any]] = {}
                for config in CONFIGS:
                    tag = f"{config.replace(' ', '-')}-{case}"
                    kill = Kill(fleet.agents[-1], kill_step) if kill_step else None
                    say(f"bench.rl_run: {config}, {case.replace('_', ' ')}")
                    if config == "hand-rolled":
                        runs[config] = await run_hand_rolled(session, fleet, a, tag, kill)
                    else:
                        runs[config] = await run_rlcp(session, fleet, a, tag, config.split()[1], kill)
                with_ratios(runs)
                result["cases"][case] = runs
    finally:
        stop_all(fleet.agents)
    return result


# -- the report -------------------------------------------------------------------------------
def _at(f: dict[str, Any]) -> str:
    return "not reached" if f["threshold_s"] is None else f"{f['threshold_s']:.1f} s (step {f['threshold_step']})"


def _x(value: float | None) -> str:
    return "–" if value is None else f"×{value:.2f}"


def render(r: dict[str, Any]) -> str:
    t = r["threshold"]
    out = [
        f"Weights by disk in all three (save, then each agent's disk load); {r['steps']} steps, lr {r['lr']:g}, "
        f"seed {r['seed']}, reward threshold {t:g}."
    ]
    runs = r["cases"]["no_kill"]
    out.append(
        table(
            [
                "configuration",
                "median s / step",
                "÷ hand-rolled",
                "median sample / train / sync s",
                f"reward ≥ {t:g} at",
                "÷ hand-rolled",
                "sync share",
                "max abs Δ logprob",
                "reward first → last 3",
                "wrong-weight rollouts",
            ],
            [
                [
                    c,
                    f["median_step_s"],
                    _x(f["step_ratio"]),
                    f"{f['median_sample_s']:.2f} / {f['median_train_s']:.2f} / {f['median_sync_s']:.2f}",
                    _at(f),
                    _x(f["threshold_ratio"]),
                    f"{f['sync_share']:.0%}",
                    f["mismatch_max"],
                    f"{f['reward_first']:.3f} → {f['reward_last3']:.3f}",
                    f"{run['wrong']['wrong_rollouts']} / {run['wrong']['rollouts']}",
                ]
                for c, run in runs.items()
                for f in [run["figures"]]
            ],
        )
    )
    if "kill" in r["cases"]:
        out.append(
            f"\nKill case: agent-1 SIGKILLed when step {r['kill_step']} begins to sample, started again on its "
            "base weights at the same ports:"
        )
        out.append(
            table(
                [
                    "configuration",
                    "wrong-weight rollouts",
                    "wrong tokens",
                    "tokens from weights never pushed",
                    "pushes failed at step",
                    "restart s",
                    f"reward ≥ {t:g} at",
                    "max abs Δ logprob",
                    "reward last 3",
                ],
                [
                    [
                        c,
                        f"{w['wrong_rollouts']} / {w['rollouts']}",
                        w["wrong_tokens"],
                        w["never_pushed_tokens"],
                        ", ".join(map(str, f["failed_pushes"])) or "–",
                        run["restart_s"],
                        _at(f),
                        f["mismatch_max"],
                        f"{f['reward_last3']:.3f}",
                    ]
                    for c, run in r["cases"]["kill"].items()
                    for f, w in [(run["figures"], run["wrong"])]
                ],
            )
        )
    return "\n".join(out)


def draw(r: dict[str, Any], out_dir: Path) -> Path:
    """Reward against step and wall-clock, the three configurations (`rlcp.rl.report.plot_runs`);
    the kill case in a second file."""
    ensure_matplotlib()
    from rlcp.rl.report import plot_runs

    paths = []
    for case, name, title in (
        ("no_kill", "rl_run", "Same trainer, three ways (weights by disk)"),
        ("kill", "rl_run_kill", f"Agent SIGKILLed at step {r.get('kill_step')}"),
    ):
        if case in r["cases"]:
            runs = {c: [StepRecord(**rec) for rec in run["records"]] for c, run in r["cases"][case].items()}
            paths.append(plot_runs(runs, out_dir / f"{name}.png", title=title))
    return paths[0]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="training steps per configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-2, help="Adam's learning rate")
    p.add_argument("--threshold", type=float, default=0.5, help="the reward the time-to-threshold figure waits for")
    p.add_argument("--kill-step", type=int, default=4, help="the kill case's step (0: no kill case)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    a = p.parse_args(argv)
    if a.steps < 1 or not 0 <= a.kill_step <= a.steps:
        p.error("--steps must be >= 1 and --kill-step between 0 and --steps")
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="bench-rl-run-") as tmp:
        measured = asyncio.run(measure(a, Path(tmp)))
    result = {
        "steps": a.steps,
        "seed": a.seed,
        "lr": a.lr,
        "threshold": a.threshold,
        "kill_step": a.kill_step,
        "transport": "disk",
        **measured,
    }
    return report("rl_run", result, a.out, text=render(result), draw=lambda out: draw(result, out))


if __name__ == "__main__":
    main()

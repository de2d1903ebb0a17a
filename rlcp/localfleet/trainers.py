"""The trainers a local fleet run drives once the fleet is up: `learn`, the RL run of `rlcp.rl`
(vLLM engines); `learn_with_trl`, TRL's own AsyncGRPOTrainer in a process of its own; and
`DemoTrainer.run_steps`, noise weights pushed every step while `Rollouts` keep the fleet's one
endpoint busy (`--trainer noise`, the only one `--sim` has). `DemoTrainer` is also how the run
reads the controller's state and waits for the fleet, whichever trainer it runs."""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from rlcp.harness.checkpoints import write_checkpoint, write_perturbed
from rlcp.harness.churn import Churn
from rlcp.harness.processes import child_env, stop_child
from rlcp.localfleet.processes import FleetError, Processes
from rlcp.localfleet.report import YES_NO, print_workers, say

PROMPTS = [
    "The quick brown fox",
    "Reinforcement learning updates",
    "A fleet of inference engines",
    "Weights move from the trainer",
    "Pause, update, verify and resume",
]


def write_step_weights(workdir: Path, step: int, base: Path | None) -> Path:
    """What a trainer writes after step `step`: the base weights plus noise that grows with
    the step (vLLM mode), or a small fresh checkpoint SimEngine can digest (--sim)."""
    out = workdir / "steps" / f"step-{step}"
    return write_checkpoint(out, step) if base is None else write_perturbed(base, out, step, 0.01 * step)


@dataclass
class Rollouts:
    """Rollout traffic through the fleet's one inference endpoint (the controller's gateway, or Envoy),
    one request in flight per agent, so every weight update happens under load as in a real
    RL run. Each answer names the weights that produced it (`X-RL-Weight-Version`): the tally."""

    session: aiohttp.ClientSession
    gateway: str
    streams: int
    model: str
    version: str | None  # the version rollouts are tallied under before the first answer names one
    ok: int = 0
    failed: int = 0
    by_version: collections.Counter[str | None] = field(default_factory=collections.Counter)
    turn: itertools.count[int] = field(default_factory=itertools.count)

    async def run(self) -> None:
        await asyncio.gather(*(self._loop() for _ in range(self.streams)))

    async def _loop(self) -> None:
        while True:
            i = next(self.turn)
            body = {"model": self.model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16}
            try:
                async with self.session.post(
                    f"{self.gateway}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=60)
                ) as resp:
                    await resp.read()
                    resp.raise_for_status()
                    version = resp.headers.get("X-RL-Weight-Version") or self.version
                self.ok += 1
                self.by_version[version] += 1
            except (aiohttp.ClientError, TimeoutError):
                self.failed += 1
                await asyncio.sleep(0.5)  # a refused port does not become a busy loop

    async def wait_for(self, ok: int, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        while self.ok < ok:
            if time.monotonic() > deadline:
                raise FleetError(f"rollouts stalled ({self.failed} failed; is the fleet paused?)")
            await asyncio.sleep(0.05)


@dataclass
class DemoTrainer:
    """The trainer's side: one controller call per step, and the state it reads back."""

    session: aiohttp.ClientSession
    url: str
    token: str
    args: argparse.Namespace
    base: Path | None  # the base model (vLLM mode), None with --sim

    async def call(self, method: str, path: str, *, body: Any = None, timeout_s: float = 10.0) -> tuple[int, Any]:
        """One call with a deadline: (HTTP status, JSON body); transport failures are FleetErrors."""
        try:
            async with self.session.request(
                method,
                self.url + path,
                json=body,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                headers={"Authorization": f"Bearer {self.token}"},
            ) as resp:
                return resp.status, await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise FleetError(f"{method} {self.url}{path} failed: {type(exc).__name__}: {exc}") from exc

    async def wait_for_fleet(self, procs: Processes, deadline_s: float = 60.0) -> dict[str, Any]:
        """Until the controller sees every agent reachable and ready; returns its state."""
        deadline, state = time.monotonic() + deadline_s, dict[str, Any]()
        while time.monotonic() < deadline:
            procs.check_alive()
            try:
                status, body = await self.call("GET", "/v1/rl/state", timeout_s=5)
                state = body if isinstance(body, dict) else {"answer": body}
                workers = state.get("workers", []) if status == 200 else []
                if len(workers) == self.args.agents and all(w["reachable"] and w["ready"] for w in workers):
                    return state
            except FleetError:
                pass  # not listening yet
            await asyncio.sleep(0.25)
        raise FleetError(f"no {self.args.agents} ready workers in {deadline_s:g}s: {json.dumps(state)[:2000]}")

    async def wait_dropped(self, member: str, deadline_s: float) -> None:
        """Until the controller no longer lists `member` (a leave: it is stopped after)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            status, state = await self.call("GET", "/v1/rl/state", timeout_s=5)
            if status == 200 and member not in {w["id"] for w in state.get("workers", [])}:
                return
            await asyncio.sleep(0.25)
        raise FleetError(f"the controller still lists {member} {deadline_s:g}s after it was unlisted")

    async def wait_converged(self, version: str, deadline_s: float) -> dict[str, Any]:
        """The controller's state once every member holds `version`, or the last one read when
        `deadline_s` passed first."""
        deadline = time.monotonic() + deadline_s
        while True:
            _, body = await self.call("GET", "/v1/rl/state", timeout_s=5)
            state: dict[str, Any] = body if isinstance(body, dict) else {}
            if _converged_at(state, version) or time.monotonic() > deadline:
                return state
            await asyncio.sleep(0.25)

    async def step(self, k: int, rollouts: Rollouts) -> tuple[bool, float]:
        """Collect rollouts, write the new weights, ONE controller call: (ok, update seconds)."""
        ok0, failed0 = rollouts.ok, rollouts.failed
        await rollouts.wait_for(ok0 + self.args.rollouts_per_step, deadline_s=120)
        version, path = f"step-{k}", write_step_weights(self.args.workdir, k, self.base)
        t0 = time.monotonic()
        body = {"version": version, "source": {"kind": "disk", "path": str(path)}, "pause_mode": "keep"}
        if self.args.max_unavailable is not None:
            body["strategy"] = {"type": "rolling", "max_unavailable": self.args.max_unavailable}
        status, result = await self.call("POST", "/v1/rl/update_weights", timeout_s=400, body=body)
        duration = time.monotonic() - t0
        if status == 200:
            rollouts.version = version
        # The controller refreshes its cache after every operation: this read is the outcome.
        _, state = await self.call("GET", "/v1/rl/state", timeout_s=5)
        waited = None
        if status == 200 and not _converged_at(state, version):
            # A member listed while the update ran (a restart or a join landing mid-step) holds other
            # weights until the reconciler converges it from the version's disk copy: the step lands
            # once it has, or is not ok when it does not within an agent's start-up time.
            t1 = time.monotonic()
            state = await self.wait_converged(version, deadline_s=self.args.start_timeout)
            waited = time.monotonic() - t1
        applied = state["applied"]
        shown = result.get("status", "error") + ("" if status == 200 else f" (HTTP {status})")
        say(
            f"step {k}/{self.args.steps}  {shown:<8} update {duration:5.2f}s  applied={applied['weight_version']}"
            f"  converged={YES_NO[applied['converged']]}  verified={YES_NO[applied['verified']]}"
            f"  rollouts ok={rollouts.ok - ok0} failed={rollouts.failed - failed0}"
        )
        if status != 200:
            say(f"    {json.dumps(result.get('error') or result.get('results'))[:1000]}")
        if waited is not None:
            landed = _converged_at(state, version)
            say(
                f"    a member listed while the update ran: {'brought to' if landed else 'NOT at'} {version} "
                f"{waited:.1f}s after it" + ("" if landed else f" (--start-timeout {self.args.start_timeout:g}s)")
            )
        if bubble := result.get("bubble"):
            waves = (result.get("progress") or {}).get("waves", 1)
            say(
                f"    bubble: {waves} wave(s); at least {bubble['min_serving']}/{bubble['members']} members serving, "
                f"mean capacity {bubble['mean_capacity']:.0%} over the update"
            )
        print_workers(state)
        return status == 200 and _converged_at(state, version), duration

    async def run_steps(self, procs: Processes, rollouts: Rollouts, churn: Churn | None = None) -> bool:
        """Every step under rollout traffic, then a summary; True when every step was ok. `churn`
        changes the membership at the end of the steps it names."""
        traffic = asyncio.create_task(rollouts.run(), name="rollouts")
        steps: list[tuple[bool, float]] = []
        try:
            for k in range(1, self.args.steps + 1):
                procs.check_alive()
                steps.append(await self.step(k, rollouts))
                if churn is not None:
                    for change in churn.landed():
                        say(f"    membership during step {k}: {change}")
                    churn.on_step(k)
                    if self.args.churn_wait:
                        await churn.finish()
        finally:
            traffic.cancel()
            await asyncio.gather(traffic, return_exceptions=True)
        n_ok, durations = sum(ok for ok, _ in steps), sorted(d for _, d in steps)
        say(
            f"\nsummary: {n_ok}/{self.args.steps} steps ok"
            + (f"; update median {durations[len(durations) // 2]:.2f}s, max {durations[-1]:.2f}s" if steps else "")
            + f"; rollouts ok={rollouts.ok} failed={rollouts.failed}; by the version that served them "
            + "(X-RL-Weight-Version): "
            + " ".join(f"{v}={n}" for v, n in rollouts.by_version.items())
        )
        return bool(n_ok == self.args.steps)


async def learn(
    args: argparse.Namespace, url: str, gateway: str, token: str, base: Path | None, churn: Churn | None = None
) -> bool:
    """The RL run (`rlcp.rl`) over the fleet; True when every push landed and the engines'
    logprobs matched the trainer's within tolerance at every step. `churn` changes the
    membership at the end of the steps it names; each step's record names what landed in it."""
    assert base is not None  # parse_args: --sim has no model to learn with
    from rlcp.rl.loop import MISMATCH_TOLERANCE, RunSettings
    from rlcp.rl.run import Fleet, train_through_fleet

    settings = RunSettings(
        steps=args.steps, lr=1e-2 if args.lr is None else args.lr, seed=args.seed, mode=args.mode, push=not args.no_push
    )
    out = await train_through_fleet(
        Fleet(url, gateway, token),
        base,
        args.workdir / "rl",
        settings,
        sync=args.sync,
        label=f"rlcp-{args.mode}-{args.sync}" + ("-churn" if churn is not None else ""),
        say=say,
        on_step=None if churn is None else (lambda r: churn.on_step(r.step)),
        membership=None if churn is None else churn.landed,
        round_started=None if churn is None else churn.on_push,
        between_steps=(lambda r: churn.finish()) if churn is not None and args.churn_wait else None,
    )
    rs = out.records
    if not rs:
        say("\nsummary: no steps ran")
        return True
    head, tail = rs[:3], rs[-3:]
    worst = max((r.mismatch_max for r in rs if r.mismatch_max is not None), default=None)
    failed = [r.step for r in rs if r.sync_error]
    say(
        f"\nsummary: reward {sum(r.reward for r in head) / len(head):.3f} (first {len(head)} steps) -> "
        f"{sum(r.reward for r in tail) / len(tail):.3f} (last {len(tail)}) in {rs[-1].wall_s:.0f}s; "
        f"largest |Δlogprob| {'-' if worst is None else f'{worst:.1e}'} (tolerance {MISMATCH_TOLERANCE:g}); "
        f"pushes failed: {failed or 'none'}"
    )
    say(f"log: {out.log}" + (f"\nplot: {out.plot}" if out.plot else "  (no plot: matplotlib is not installed)"))
    matched = worst is not None and worst <= MISMATCH_TOLERANCE
    return not failed and (matched or not settings.push)


async def learn_with_trl(args: argparse.Namespace, gateway: str, base: Path | None) -> bool:
    """TRL's own AsyncGRPOTrainer (`python -m rlcp.rl.trl`, the `trl` extra) pointed at the fleet's
    one URL, in a process of its own (TRL's client blocks, and it spawns its rollout process); True
    when it trained every step and every rollout came from an adapter it published."""
    assert base is not None  # parse_args: --sim has no model to learn with
    argv = ["--url", gateway, "--model-dir", str(base), "--out", str(args.workdir / "trl"), "--steps", str(args.steps)]
    argv += ["--seed", str(args.seed)] + (["--lr", str(args.lr)] if args.lr is not None else [])
    argv += ["--no-sync"] if args.no_push else []
    say(f"TRL: {sys.executable} -m rlcp.rl.trl {' '.join(argv)}")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "rlcp.rl.trl", *argv, env=child_env())
    try:
        return await proc.wait() == 0
    finally:
        await stop_child(proc)


def _converged_at(state: dict[str, Any], version: str) -> bool:
    applied = state.get("applied") or {}
    return bool(applied.get("converged")) and applied.get("weight_version") == version

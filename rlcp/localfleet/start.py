"""Bringing the fleet up: the children's settings (every agent's engine, the controller's
gateway), then the agents and a controller over them (`start_fleet`), a controller that places
the agents on a Ray head (`start_ray_fleet`), or Envoy in front of the agents (`start_envoy`).
Each returns once what it started answers; a start that fails is a `FleetError`."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.churn import ListingServer
from rlcp.harness.envoy import EnvoyProcess
from rlcp.harness.processes import AgentProcess, ControllerProcess, ProcessError
from rlcp.harness.tiny_model import agent_engine
from rlcp.localfleet.options import RAY_NAMESPACE, RAY_PREFIX, LoraFlags
from rlcp.localfleet.processes import FleetError, Processes
from rlcp.localfleet.report import say


def vllm_engine(base: Path, *, lora: LoraFlags | None = None) -> dict[str, Any]:
    """The agents' engine: the tiny model, with this project's CPU weight-transfer backend
    (gloo) so the trainer can broadcast to it. Adapters only with `--lora` (the RL run trains
    the base weights)."""
    return agent_engine(base, **lora_section(lora), extra_engine_args={"weight_transfer_config": {"backend": "gloo"}})


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


def gateway_section(args: argparse.Namespace) -> dict[str, Any]:
    """The controller's `gateway` settings: its Python gateway on `--gateway-port`, or, with
    `--envoy`, the xDS server for Envoy on a port it picks (the state document names it)."""
    if args.envoy:
        return {"host": "127.0.0.1", "port": 0, "data_plane": "envoy", "envoy": {"xds_port": 0}}
    return {"host": "127.0.0.1", "port": args.gateway_port}


def controller_common(args: argparse.Namespace, admin_token: str) -> dict[str, Any]:
    """The controller settings every kind of local fleet shares: its workers' token and deadlines,
    a quick reconciler, the desired state in the work dir, and JSON logs."""
    return {
        "workers": {"token": admin_token, "timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 300},
        "reconcile": {"poll_interval_s": 0.5, "interval_s": 0.5, "backoff_initial_s": 0.5, "backoff_max_s": 10},
        "store": {"kind": "file", "path": str(args.workdir / "state" / "desired.json")},
        "allowed_roots": [str(args.workdir)],
        "log_format": "json",
    }


async def controller_url(child: ControllerProcess, args: argparse.Namespace) -> str:
    """The controller's URL once it serves; a start that fails is a `FleetError` (with a hint
    when `--port` may be taken)."""
    try:
        port = (await child.wait_ready_async()).port
    except ProcessError as exc:
        hint = f"\n(is port {args.port} taken? --port 0 picks a free one)" if args.port else ""
        raise FleetError(f"{exc}{hint}") from None
    return f"http://127.0.0.1:{port}"


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


async def start_ray_head(args: argparse.Namespace) -> Any:
    """A local Ray head (loopback only) with a CPU for every agent there will be at once: each
    placed agent's bundle takes one, and `--churn`'s joins add theirs."""
    from rlcp.harness.raycluster import RayHead, RayHeadDied

    say("starting a local Ray head (loopback only, ~5-10 s) ...")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    joins = sum(e.action == "join" for e in args.churn or [])
    try:
        return await asyncio.to_thread(
            RayHead(num_cpus=max(2, args.agents + joins)).start, timeout_s=args.start_timeout
        )
    except (RayHeadDied, AssertionError) as exc:  # it died; it did not listen in time (`wait_for_sync`)
        raise FleetError(f"the local Ray head did not start: {exc}") from None


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
                **head.placed_fleet(
                    RAY_NAMESPACE,
                    RAY_PREFIX,
                    agent,
                    replicas=args.agents,
                    bundle={"CPU": 1},
                    discovery={"interval_s": 0.5, "timeout_s": 5},
                    placement={"agent_start_timeout_s": args.start_timeout, "strategy": "PACK", "interval_s": 1},
                ),
                **controller_common(args, admin_token),
            },
            run_dir,
            log_path=log_dir / "controller.log",
            env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        )
    )
    return [], await controller_url(child, args), api_token


@dataclass
class AgentLauncher:
    """Starts one agent of this fleet (`python -m rlcp.agent` on the fleet's engine) and returns
    it once it serves: the first ones, and with `--churn` the joiners."""

    args: argparse.Namespace
    procs: Processes
    engine: dict[str, Any]
    admin_token: str
    t0: float = field(default_factory=time.monotonic)

    async def __call__(self, name: str, index: int) -> AgentProcess:
        return await self.ready(self.spawn(name, index))

    async def ready(self, child: AgentProcess) -> AgentProcess:
        """`child` once it serves (its ports said)."""
        ports = (await child.wait_ready_async()).ports
        say(
            f"  {child.name} up after {time.monotonic() - self.t0:.1f}s: admin :{ports['admin_port']}, "
            f"inference :{ports['inference_port']}"
        )
        return child

    def spawn(self, name: str, index: int) -> AgentProcess:
        """Start the agent `name` and return at once (`ready` waits for it)."""
        args = self.args
        # vLLM's CPU backend binds every engine's threads to the same cores by default
        # ("auto"); one core each lets N engines on one machine run side by side. Under vLLM's
        # multiprocessing executor only: by default the agents run on one OpenMP thread each
        # (`engine_env`), which does the same.
        bind = (
            {}
            if "VLLM_CPU_OMP_THREADS_BIND" in os.environ
            else {"VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1))}
        )
        return self.procs.spawn(
            AgentProcess(
                {
                    "agent_id": name,
                    "admin": {"port": 0, "token": self.admin_token},
                    "inference": {"port": 0},
                    "engine": self.engine,
                    "allowed_roots": [str(args.workdir)],
                    "require_desired_version": True,
                    "log_format": "json",
                },
                args.workdir / "run",
                name=name,
                env=bind,
                start_timeout_s=args.start_timeout,
                log_path=args.workdir / "logs" / f"{name}.log",
            )
        )


async def start_fleet(
    args: argparse.Namespace,
    procs: Processes,
    base: Path | None,
    *,
    listing: ListingServer | None = None,
    launcher: AgentLauncher | None = None,
    started: dict[str, AgentProcess] | None = None,
) -> tuple[list[dict[str, Any]], str, str]:
    """The agents (concurrently), then the controller over them: (specs, URL, API token). With a
    started `listing`, the agents are listed there and the controller discovers them from it
    (`http_listing`, polled every 0.25 s), so the membership can change during the run
    (`--churn`); `started` gets the agents by id, and `launcher` (made here when not given; its
    admin token is the fleet's) starts more. Without a listing, a static list."""
    # The children's environment drops RLAGENT_/RLCP_ settings (rlcp.harness.processes.child_env): a
    # token left exported by an earlier shell would override the generated ones.
    launch = launcher or AgentLauncher(args, procs, engine_section(args, base), secrets.token_urlsafe(16))
    admin_token, api_token = launch.admin_token, secrets.token_urlsafe(16)
    run_dir, log_dir = args.workdir / "run", args.workdir / "logs"
    say(f"starting {args.agents} agents{'' if base is None else ' (vLLM: ~40-80 s)'}; logs in {args.workdir / 'logs'}")
    names = [f"agent-{i}" for i in range(args.agents)]
    children = await asyncio.gather(*(launch(name, i) for i, name in enumerate(names)))
    specs = [c.spec(name) for name, c in zip(names, children, strict=True)]
    if started is not None:
        started.update(zip(names, children, strict=True))
    discovery: dict[str, Any] = {"kind": "static", "static": specs}
    if listing is not None:
        for spec in specs:
            listing.list(WorkerSpec(**spec))
        discovery = {
            "kind": "http_listing",
            "http_listing": {"url": listing.url, "interval_s": 0.25, "timeout_s": 2, "default_flavor": "agent"},
        }
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
                "discovery": discovery,
                **controller_common(args, admin_token),
            },
            run_dir,
            log_path=log_dir / "controller.log",
        )
    )
    return specs, await controller_url(child, args), api_token

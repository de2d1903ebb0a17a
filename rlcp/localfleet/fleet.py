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

This module runs the fleet (`run`, `main`); beside it, each part has a module of its own:
the flags (`options`), the processes and their supervision (`processes`), bringing the fleet
up (`start`), the trainers (`trainers`), and what the user is told (`report`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from rlcp.client.client import ControlPlaneClient
from rlcp.harness.churn import Churn, ListedMembers, ListingServer, StartAgent
from rlcp.harness.placed_churn import PlacedMembers
from rlcp.harness.processes import AgentProcess, ProcessError
from rlcp.localfleet.options import RAY_NAMESPACE, RAY_PREFIX, parse_args
from rlcp.localfleet.processes import FleetError, Processes
from rlcp.localfleet.report import banner, print_workers, say
from rlcp.localfleet.start import (
    AgentLauncher,
    engine_section,
    start_envoy,
    start_fleet,
    start_ray_fleet,
    start_ray_head,
)
from rlcp.localfleet.trainers import DemoTrainer, Rollouts, learn, learn_with_trl


async def run(args: argparse.Namespace, base: Path | None) -> int:
    """Bring the fleet up, run the steps, and stop every process it started, whatever happens."""
    procs, task, t0 = Processes(args.workdir), asyncio.current_task(), time.monotonic()
    got: list[signal.Signals] = []
    model = "sim" if base is None else "tiny"
    head, supervision, listing, churn = None, None, None, None

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
            head = await start_ray_head(args)
            specs, url, token = await start_ray_fleet(args, procs, base, head)
        else:
            # The members as a listing the controller polls, so they can change during the run.
            listing, started = ListingServer(), dict[str, AgentProcess]()
            await listing.start()
            launcher = AgentLauncher(args, procs, engine_section(args, base), secrets.token_urlsafe(16))
            joiners = standby_joiners(args, launcher) if args.churn else launcher  # they start with the rest
            specs, url, token = await start_fleet(
                args, procs, base, listing=listing, launcher=launcher, started=started
            )
            supervision = asyncio.create_task(procs.supervise().run(), name="supervisor")
        async with aiohttp.ClientSession() as session, contextlib.AsyncExitStack() as stack:
            trainer = DemoTrainer(session, url, token, args, base)
            if args.churn and listing is not None:
                members = ListedMembers(
                    listing,
                    started,
                    joiners,
                    lambda member: trainer.wait_dropped(member, deadline_s=60.0),
                    supervisor=procs.supervisor,
                    down_on_purpose=procs.down_on_purpose,
                    on_restart=lambda child: procs.note_pids(),
                )
                churn = planned(Churn.listed(args.churn, members, say=say))
            state = await trainer.wait_for_fleet(procs, deadline_s=args.start_timeout if args.ray else 60.0)
            if args.churn and head is not None:
                placer = await stack.enter_async_context(ControlPlaneClient(url, token=token, timeout_s=30))
                churn = planned(placed_churn(args, head, placer))
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
                all_ok = await learn(args, url, gateway, token, base, churn)
            elif args.trainer == "trl":
                all_ok = await learn_with_trl(args, gateway, base)
            else:
                rollouts = Rollouts(session, gateway, args.agents, model, version)
                all_ok = await trainer.run_steps(procs, rollouts, churn)
            if churn is not None:
                all_ok = await churn_done(churn, deadline_s=args.start_timeout) and all_ok
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
        if churn is not None:
            await churn.close()
        if listing is not None:
            await listing.close()
        if supervision is not None:
            supervision.cancel()  # nothing is restarted while the fleet stops
        t_stop = time.monotonic()
        procs.stop()  # the controller first: with teardown it removes the actors it placed
        if head is not None:
            head.stop()
        n = len(procs.children) + (procs.envoy is not None)
        say(f"stopped {n} processes{' and the Ray head' if head else ''} in {time.monotonic() - t_stop:.1f}s")


def placed_churn(args: argparse.Namespace, head: Any, client: ControlPlaneClient) -> Churn:
    """`--churn` on a fleet the controller places on the Ray head `head`: through placement."""
    placed = PlacedMembers(client, head, RAY_NAMESPACE, RAY_PREFIX, deadline_s=args.start_timeout)
    order = [f"{RAY_PREFIX}{i}" for i in range(args.agents)]
    return Churn(args.churn, placed, order, started=args.agents, say=say, prefix=RAY_PREFIX)


def planned(churn: Churn) -> Churn:
    say("membership changes planned (at the end of the step): " + ", ".join(map(str, churn.events)))
    return churn


def standby_joiners(args: argparse.Namespace, launcher: AgentLauncher) -> StartAgent:
    """The joiners of `args.churn`, started now, with the first agents, as warm standbys (an engine
    start-up takes 30-120 s here, longer than a whole run's steps); a join lists its standby once it
    serves (at its step, or when it is up if later). Names and order as `Churn` gives them
    (`check_churn`)."""
    names = [f"agent-{args.agents + i}" for i, e in enumerate(e for e in args.churn if e.action == "join")]
    standby = {name: launcher.spawn(name, args.agents + i) for i, name in enumerate(names)}
    if names:
        say(f"starting {', '.join(names)} too, as standby for the planned joins (listed at their step)")

    async def join(name: str, index: int) -> AgentProcess:
        child = standby.pop(name, None)
        return await (launcher(name, index) if child is None else launcher.ready(child))

    return join


async def churn_done(churn: Churn, deadline_s: float) -> bool:
    """The membership changes still under way when the steps ended (a restart), finished; each
    change said with the step it followed and how long it took to land. False when one failed."""
    try:
        await asyncio.wait_for(churn.finish(), deadline_s)
        ok = True
    except (FleetError, ProcessError, TimeoutError) as exc:
        say(f"a membership change failed: {exc}")
        ok = False
    say(
        "membership changes: "
        + ("; ".join(f"{c.what} after step {c.step} (+{c.seconds:.1f}s)" for c in churn.history) or "none")
    )
    return ok


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

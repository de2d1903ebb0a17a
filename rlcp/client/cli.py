"""`rlctl`: inspect and steer the fleet from a terminal.

    rlctl state [--watch] [-o json|yaml]     rlctl pause --mode keep     rlctl resume
    rlctl sleep [--level N] [-l SEL]         rlctl wake [-l SEL]
    rlctl update-weights --version V --path P [--max-unavailable 25%] [--no-wait] [--manifest F]
    rlctl lora load NAME PATH | unload NAME    rlctl workers    rlctl ops [show ID [--follow]]
    rlctl placement    rlctl scale N|default     (placement.kind ray: the agents the controller keeps)
    rlctl fleets       rlctl --fleet teacher state   (settings `fleets`: any command, for one named fleet)

An update is followed with a progress bar (waves, workers updated) until it ends; with
--no-wait, rlctl prints its id and leaves it running (`rlctl ops show ID --follow` picks it up).

The controller URL and token come from --url/--token, then RLCTL_URL/RLCTL_TOKEN, then
the config file (~/.config/rlctl/config.yaml: `url:`, `token:`, `fleet:`). Exit codes: 0 ok,
1 an operation failed on some workers, 2 the controller could not be used (unreachable,
401, bad input) -- always one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml
from rich.console import Console
from rich.live import Live

from rlcp.client.client import ControlPlaneClient, ControlPlaneClientError, OperationFailed
from rlcp.client.render import (
    fleets_table,
    operation_table,
    operations_table,
    placement_table,
    progress_fields,
    state_view,
    update_progress,
    workers_table,
)
from rlcp.core.wire.controller.operations import OperationResult

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_CONFIG = Path.home() / ".config" / "rlctl" / "config.yaml"
console = Console()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlctl", description="Inspect and steer an RL fleet's control plane.")
    p.add_argument("--url", help=f"controller URL (env RLCTL_URL; default {DEFAULT_URL})")
    p.add_argument("--token", help="API token (env RLCTL_TOKEN)")
    p.add_argument(
        "--fleet",
        help="a named fleet (env RLCTL_FLEET; `rlctl fleets` lists them); default: the "
        "default fleet, served at the controller's root",
    )
    p.add_argument("--config", type=Path, help=f"YAML with url/token (default {DEFAULT_CONFIG})")
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    p.add_argument("--timeout", type=float, default=30.0, help="deadline of a read, in seconds")
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("state", help="fleet summary and one row per worker")
    st.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    st.add_argument("--interval", type=float, default=1.0, help="refresh interval, in seconds")
    st.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # test seam: refreshes
    wk = sub.add_parser("workers", help="the members, as the controller lists them")
    pa = sub.add_parser("pause", help="pause every member (with -l, the matching ones, held paused)")
    pa.add_argument("--mode", choices=("abort", "wait", "keep"), default="keep")
    pa.add_argument("--timeout", dest="op_timeout", type=float, default=None, help="deadline to quiesce, seconds")
    rs = sub.add_parser("resume", help="resume every member, releasing every hold (with -l, the matching ones)")
    sl = sub.add_parser(
        "sleep",
        help="put members to sleep (all, or with -l / --worker): out of the gateway's fence, kept asleep until woken",
    )
    sl.add_argument("--level", type=int, choices=(1, 2), default=1, help="1: offload weights; 2: discard them")
    sl.add_argument("--mode", choices=("abort", "wait"), default="abort", help="what happens to running requests")
    sl.add_argument("--timeout", dest="op_timeout", type=float, default=None, help="deadline of each sleep, seconds")
    wu = sub.add_parser("wake", help="wake members asleep, verify them, return them to service")
    wu.add_argument(
        "--tags",
        choices=("weights", "kv_cache"),
        action="append",
        default=None,
        help="wake only this allocation (repeatable); the members stay asleep",
    )
    for cmd in (sl, wu):
        cmd.add_argument("--worker", dest="worker_ids", action="append", default=None, help="this member (repeatable)")
    for cmd in (st, wk, pa, rs, sl, wu):
        cmd.add_argument(
            "-l",
            "--selector",
            default=None,
            help="label selector, as kubectl's: role=policy, zone in (a,b), !canary (comma = AND)",
        )
    en = sub.add_parser("engine", help="run an allowlisted engine route (settings engine_routes.allow)")
    en.add_argument("route")
    en.add_argument("-l", "--selector", default=None, help="only the members this label selector matches")
    en.add_argument("--worker", default=None, help="only this member")
    en.add_argument("--body", type=json_object, default=None, help="JSON object sent to a POST route")
    up = sub.add_parser("update-weights", help="pause, load, verify, resume")
    up.add_argument("--version", required=True)
    up.add_argument("--path", required=True, help="safetensors directory every worker can read")
    up.add_argument("--pause-mode", choices=("abort", "wait", "keep"), default="keep")
    up.add_argument("--no-verify", action="store_true")
    up.add_argument("--timeout", dest="op_timeout", type=float, default=None, help="deadline per phase, seconds")
    up.add_argument(
        "--max-unavailable",
        type=count_or_percent,
        default=None,
        help="roll in waves of this many members (a count, or a percentage like 25%%)",
    )
    up.add_argument("--no-wait", action="store_true", help="print the operation's id and leave it running")
    up.add_argument(
        "--manifest",
        type=Path,
        default=None,
        help="JSON file of the version's expected weight checksums ({name: sha256})",
    )
    lo = sub.add_parser("lora", help="load or unload an adapter fleet-wide")
    lsub = lo.add_subparsers(dest="lora_command", required=True)
    ll = lsub.add_parser("load")
    ll.add_argument("name")
    ll.add_argument("path")
    ll.add_argument("--version")
    lu = lsub.add_parser("unload")
    lu.add_argument("name")
    sub.add_parser("fleets", help="the controller's fleets: members, versions, models the gateway routes there")
    sub.add_parser("placement", help="the agents placement keeps, and its last pass")
    sc = sub.add_parser("scale", help="keep N agents placed (placement.kind ray)")
    sc.add_argument(
        "replicas", type=replicas_or_default, help="a count, or `default` to hand the count back to the settings"
    )
    ops = sub.add_parser("ops", help="recent operations, or one of them")
    ops.add_argument("--limit", type=int, default=20, help="how many, newest first (1-64)")
    osub = ops.add_subparsers(dest="ops_command")
    show = osub.add_parser("show", help="one operation, with a weight update's progress and bubble")
    show.add_argument("id")
    show.add_argument("--follow", action="store_true", help="follow it with a progress bar until it ends")
    return p


def json_object(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError('a JSON object, e.g. \'{"request_ids": ["r1"]}\'')
    return parsed


def count_or_percent(value: str) -> int | str:
    """A rolling update's `max_unavailable` from the command line: `3` or `25%`."""
    if value.endswith("%"):
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a count nor a percentage") from None


def replicas_or_default(value: str) -> int | None:
    if value == "default":
        return None
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a count nor `default`") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{count} agents: the count cannot be negative")
    return count


def read_manifest(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ControlPlaneClientError(f"cannot read the manifest {path}: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("checksums"), dict):
        data = data["checksums"]  # the shape `POST /weight_checker` answers
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ControlPlaneClientError(f"the manifest {path} is not a JSON object of tensor name -> checksum")
    return data


def connection(args: argparse.Namespace) -> tuple[str, str | None]:
    config: dict[str, Any] = {}
    path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    if path is not None:
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ControlPlaneClientError(f"cannot read config {path}: {exc}") from exc
    url = (args.url or os.environ.get("RLCTL_URL") or config.get("url") or DEFAULT_URL).rstrip("/")
    token = args.token or os.environ.get("RLCTL_TOKEN") or config.get("token")
    fleet = args.fleet or os.environ.get("RLCTL_FLEET") or config.get("fleet")
    if fleet and fleet != "default" and args.command != "fleets":
        url += f"/fleets/{quote(fleet, safe='')}"  # a named fleet's whole API lives under its path
    return url, token


def emit(data: Any, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")


async def show_operation(result: OperationResult, fmt: str) -> None:
    if fmt == "table":
        console.print(operation_table(result))
    else:
        emit(result.model_dump(mode="json"), fmt)


async def run_operation(client: ControlPlaneClient, call: Awaitable[OperationResult], fmt: str) -> int:
    """Run one fleet operation; 0 when ok, 1 when some worker failed (the table says which)."""
    try:
        result = await call
    except OperationFailed as exc:
        await show_operation(exc.result, fmt)
        return 1
    await show_operation(result, fmt)
    return 0


async def follow(client: ControlPlaneClient, op: OperationResult, fmt: str, *, poll_s: float = 0.3) -> int:
    """Follow a running operation to its end, with a progress bar on a terminal table; 0 when
    every worker ended ok, 1 when some failed (the table says which)."""
    if fmt != "table":
        return await run_operation(client, client.wait_operation(op.id, poll_s=poll_s), fmt)
    with update_progress(console) as bar:
        task = bar.add_task(op.kind, total=None, note="")
        return await run_operation(
            client,
            client.wait_operation(op.id, poll_s=poll_s, on_update=lambda now: bar.update(task, **progress_fields(now))),
            fmt,
        )


async def run(args: argparse.Namespace) -> int:
    url, token = connection(args)
    async with ControlPlaneClient(url, token=token, timeout_s=args.timeout) as client:
        match args.command:
            case "state":
                return await state(client, args)
            case "update-weights":
                return await update_weights(client, args)
            case "ops" if args.ops_command == "show":
                op = await client.operation(args.id)
                if args.follow and op.status == "running":
                    return await follow(client, op, args.output)
                await show_operation(op, args.output)
                return 0 if op.status in ("ok", "running") else 1
            case "pause" | "resume" | "sleep" | "wake" | "engine" | "lora":
                return await run_operation(client, operation_call(client, args), args.output)
            case _:
                await show_listing(client, args)
                return 0


def operation_call(client: ControlPlaneClient, args: argparse.Namespace) -> Awaitable[OperationResult]:
    """The client call of a command that runs one fleet operation and waits for it."""
    match args.command:
        case "pause":
            return client.pause(args.mode, args.op_timeout, selector=args.selector)
        case "resume":
            return client.resume(selector=args.selector)
        case "sleep":
            return client.sleep(
                args.level,
                mode=args.mode,
                timeout_s=args.op_timeout,
                selector=args.selector,
                worker_ids=args.worker_ids,
            )
        case "wake":
            return client.wake_up(tags=args.tags, selector=args.selector, worker_ids=args.worker_ids)
        case "engine":
            return client.engine(args.route, worker=args.worker, selector=args.selector, body=args.body)
        case "lora" if args.lora_command == "load":
            return client.load_lora(args.name, args.path, args.version)
        case "lora":
            return client.unload_lora(args.name)
    raise AssertionError(args.command)


async def update_weights(client: ControlPlaneClient, args: argparse.Namespace) -> int:
    """Start an update; follow it to its end unless `--no-wait` (then print its id)."""
    manifest = read_manifest(args.manifest) if args.manifest else None
    started = await client.update_weights(
        args.version,
        args.path,
        pause_mode=args.pause_mode,
        verify=not args.no_verify,
        timeout_s=args.op_timeout,
        max_unavailable=args.max_unavailable,
        wait=False,
        expected_checksums=manifest,
    )
    if args.no_wait:
        console.print(started.id) if args.output == "table" else emit(started.model_dump(mode="json"), args.output)
        return 0
    return await follow(client, started, args.output)


async def show_listing(client: ControlPlaneClient, args: argparse.Namespace) -> None:
    """The read-only commands: a table on a terminal, else the body in the chosen format."""
    match args.command:
        case "workers":
            body = await client.workers(args.selector)
            console.print(workers_table(body)) if args.output == "table" else emit(body, args.output)
        case "fleets":
            listing = await client.fleets()
            console.print(fleets_table(listing)) if args.output == "table" else emit(
                listing.model_dump(mode="json"), args.output
            )
        case "placement" | "scale":
            view = await (client.placement() if args.command == "placement" else client.scale(args.replicas))
            console.print(placement_table(view)) if args.output == "table" else emit(
                view.model_dump(mode="json"), args.output
            )
        case "ops":
            ops = await client.operations(args.limit)
            if args.output == "table":
                console.print(operations_table(ops))
            else:
                emit([op.model_dump(mode="json") for op in ops], args.output)
        case _:
            raise AssertionError(args.command)


async def state(client: ControlPlaneClient, args: argparse.Namespace) -> int:
    if args.output != "table":
        emit(await client.state_raw(args.selector), args.output)
        return 0
    if not args.watch:
        console.print(state_view(await client.state(args.selector)))
        return 0
    refreshes = 0
    with Live(state_view(await client.state(args.selector)), console=console, auto_refresh=False) as live:
        while args.count is None or refreshes < args.count:
            await asyncio.sleep(args.interval)
            live.update(state_view(await client.state(args.selector)), refresh=True)
            refreshes += 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(run(args))
    except ControlPlaneClientError as exc:
        print(f"rlctl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0 if args.command == "state" else 130


if __name__ == "__main__":
    sys.exit(main())

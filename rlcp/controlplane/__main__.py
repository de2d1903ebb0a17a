"""`rl-controlplane` / `python -m rlcp.controlplane`: run the controller daemon.

By default (`api.front: true`) the daemon is two processes: the front on the public port and
the core behind it (`rlcp/controlplane/front/`); `--core` is how the front starts the core.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlcp.controlplane.settings import ControllerSettings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    from rlcp.controlplane.settings import load_settings
    from rlcp.core.entry import settings_or_exit

    settings = settings_or_exit(
        parser, lambda: load_settings(args.config), check=lambda s: (s.api.resolved_token(), s.workers.resolved_token())
    )
    token = settings.api.resolved_token()
    from rlcp.controlplane.front.daemon import CoreStartFailed

    try:
        serving = (
            _front(settings, args, token) if settings.api.front and not args.core else _core(settings, args, token)
        )
        return asyncio.run(serving)
    except CoreStartFailed as exc:
        print(f"rl-controlplane: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the port is taken, the address is wrong, ...
        print(
            f"rl-controlplane: cannot serve on {settings.api.host}:{settings.api.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-controlplane", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="YAML settings file (env RLCP_* overrides it)")
    parser.add_argument("--port-file", type=Path, help="write the bound API port here once serving")
    parser.add_argument(
        "--core", action="store_true", help="run as the core behind a front (internal: stops when stdin closes)"
    )
    return parser


# The heavy imports are made once the arguments are read, so `--help` and a settings error answer at once.
async def _core(settings: ControllerSettings, args: argparse.Namespace, token: str) -> int:
    """The controller itself: serve until a signal, or (as a front's core) until stdin closes."""
    import structlog
    from aiohttp import web

    from rlcp.controlplane.assembly import assemble
    from rlcp.controlplane.front.daemon import write_port_file
    from rlcp.core.entry import ignore_signals_from_now, stop_on_signals
    from rlcp.core.heap import settle

    stop = stop_on_signals()
    if args.core:  # stdin closed: the front is gone, or asks the core to stop
        loop, stdin = asyncio.get_running_loop(), sys.stdin.fileno()

        def front_gone() -> None:
            loop.remove_reader(stdin)  # a closed pipe stays readable: once is enough
            stop.set()

        loop.add_reader(stdin, front_gone)
    runner = web.AppRunner(assemble(settings, token=token), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.api.host, settings.api.port)
    await site.start()
    port = runner.addresses[0][1]
    write_port_file(args.port_file, port)
    frozen = settle()  # startup's heap, out of the collector's sight (rlcp/core/heap.py)
    structlog.get_logger("rlcp.controlplane").info(
        "core_ready" if args.core else "controller_ready", port=port, heap_frozen=frozen
    )
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # the placement teardown included
        ignore_signals_from_now()
    return 0


async def _front(settings: ControllerSettings, args: argparse.Namespace, token: str) -> int:
    from rlcp.controlplane.front.daemon import serve
    from rlcp.core.entry import ignore_signals_from_now, stop_on_signals

    try:
        return await serve(
            settings,
            token=token,
            config=args.config,
            port_file=args.port_file,
            stop=stop_on_signals(),
        )
    finally:
        ignore_signals_from_now()


if __name__ == "__main__":
    sys.exit(main())

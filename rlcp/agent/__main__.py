"""`rl-agent` / `python -m rlcp.agent`: run one agent (engine + admin port + inference port)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from pydantic import ValidationError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-agent", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML settings file (env RLAGENT_* overrides it)")
    parser.add_argument("--ports-file", type=Path, help="write the bound ports here as JSON once ready")
    args = parser.parse_args(argv)

    from rlcp.agent.settings import load_settings
    from rlcp.core.logs import configure_logging

    try:
        settings = load_settings(args.config)
        settings.admin.resolved_token()
    except (ValidationError, ValueError, OSError) as exc:
        print(f"rl-agent: bad settings: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)

    from rlcp.agent.runner import run_agent

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_agent(settings, stop, ports_file=args.ports_file)

    asyncio.run(_run())
    return 0


if __name__ == "__main__":  # vLLM spawns engine processes: keep this guard
    sys.exit(main())

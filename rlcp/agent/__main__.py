"""`rl-agent` / `python -m rlcp.agent`: run one agent (engine + admin port + inference port)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-agent", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML settings file (env RLAGENT_* overrides it)")
    parser.add_argument("--ports-file", type=Path, help="write the bound ports here as JSON once ready")
    args = parser.parse_args(argv)

    from rlcp.agent.settings import load_settings
    from rlcp.core.entry import settings_or_exit, stop_on_signals

    settings = settings_or_exit(parser, lambda: load_settings(args.config), check=lambda s: s.admin.resolved_token())

    from rlcp.agent.runner import run_agent

    async def _run() -> int:
        return await run_agent(settings, stop_on_signals(), ports_file=args.ports_file)

    return asyncio.run(_run())


if __name__ == "__main__":  # vLLM spawns engine processes: keep this guard
    sys.exit(main())

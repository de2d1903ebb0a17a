"""What every process's entry point (`__main__`) does the same way: read its settings, where a
bad one ends the process before anything starts (`<prog>: bad settings: ...` on stderr, exit
status 2, as argparse ends it for a bad argument), configure logging from them, and stop on
SIGINT or SIGTERM.

    settings = settings_or_exit(parser, lambda: load_settings(args.config),
                                check=lambda s: s.admin.resolved_token())
    ...
    stop = stop_on_signals()  # inside the event loop
    ...
    ignore_signals_from_now()  # stopped: the process only exits now
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable
from typing import Protocol, TypeVar

from pydantic import ValidationError

from rlcp.core.logs import configure_logging


class _Logged(Protocol):
    @property
    def log_format(self) -> str: ...

    @property
    def log_level(self) -> str: ...


S = TypeVar("S", bound=_Logged)


def settings_or_exit(
    parser: argparse.ArgumentParser, load: Callable[[], S], *, check: Callable[[S], object] | None = None
) -> S:
    """`load()`, then `check` on what it loaded (a token file that cannot be read is a bad
    setting too); on either's failure the process exits 2 saying why. Logging is configured
    from the settings before they are returned."""
    try:
        settings = load()
        if check is not None:
            check(settings)
    except (ValidationError, ValueError, OSError) as exc:
        parser.exit(2, f"{parser.prog}: bad settings: {exc}\n")
    configure_logging(settings.log_format, settings.log_level)
    return settings


def stop_on_signals() -> asyncio.Event:
    """An event set at the first SIGINT or SIGTERM; call it inside the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def ignore_signals_from_now() -> None:
    """From here on SIGINT and SIGTERM change nothing; call it inside the running loop, once the
    process has stopped its work and only exits. Otherwise closing the loop puts the default
    action back, and a second signal (a process group's, arriving after the process's own stop)
    ends the exiting process by SIGTERM, which reads as a crash to whoever waits for it."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)

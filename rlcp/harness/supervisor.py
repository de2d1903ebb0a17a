"""Children kept up: a child that exits is started again, as a kubelet or Ray would (the local
fleet's agents, and the tests of an engine's death)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable

from rlcp.harness.processes import ChildProcess


class ProcessSupervisor:
    """Starts a child again when it exits, as a kubelet restarts a container (`restartPolicy:
    Always`) or Ray an actor: same config, same files (an agent: same ports), after a back-off
    that doubles from `backoff_s` up to 30 s, at most `max_restarts` times each; past that the
    child is given up (`gave_up`). An agent ends itself when its engine dies
    (`exit_on_engine_death`), so this is what brings a local fleet back to full strength.
    `on_restart(child, exit_status, restarts)` is told each restart."""

    def __init__(
        self,
        children: Iterable[ChildProcess],
        *,
        max_restarts: int = 5,
        backoff_s: float = 1.0,
        on_restart: Callable[[ChildProcess, int | None, int], None] | None = None,
    ) -> None:
        self.children = list(children)
        self.max_restarts, self.backoff_s, self.on_restart = max_restarts, backoff_s, on_restart
        self.restarts: Counter[str] = Counter()
        self.gave_up: list[ChildProcess] = []

    async def run(self, poll_s: float = 0.2) -> None:
        """Until cancelled. A child restarted is not waited for here: its ready file shows when it serves."""
        while True:
            for child in self.children:
                if child.running() or child in self.gave_up or child.proc is None:
                    continue
                status = child.proc.returncode
                if self.restarts[child.name] >= self.max_restarts:
                    self.gave_up.append(child)
                    continue
                await asyncio.sleep(min(30.0, self.backoff_s * 2 ** self.restarts[child.name]))
                self.restarts[child.name] += 1
                child.spawn()
                if self.on_restart is not None:
                    self.on_restart(child, status, self.restarts[child.name])
            await asyncio.sleep(poll_s)

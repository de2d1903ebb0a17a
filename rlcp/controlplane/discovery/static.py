"""Static discovery: the member list comes from configuration and never changes.

The simplest source, for a fixed fleet (a lab box, CI, a hand-written config). It
reports once so `Membership` syncs, then stays open: the discovery consumer treats a
source that ends as a source that failed, and a static fleet has not failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from rlcp.controlplane.workerspec import WorkerSpec


class StaticSource:
    name = "static"

    def __init__(self, workers: list[WorkerSpec]) -> None:
        # Membership keys by id: a duplicate would silently drop a worker, so the
        # config is refused up front, naming the offender.
        seen: set[str] = set()
        for spec in workers:
            if spec.id in seen:
                raise ValueError(f"duplicate worker id {spec.id!r} in the static member list")
            seen.add(spec.id)
        self._workers = list(workers)

    async def watch(self) -> AsyncIterator[list[WorkerSpec]]:
        yield list(self._workers)
        # Nothing will ever change; wait until the consumer cancels us.
        await asyncio.get_running_loop().create_future()

"""The path of one disk update through the controller, stop by stop (issue 46): a count anyone can run.

    .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/controlplane/operations/test_update_path.py

prints the path and checks it against its bounds. What is counted:

- One `POST /v1/rl/update_weights` (a disk update, all at once, then rolling) is sent to the route's
  own handler, over agents on SimEngine connected in memory (`rlcp/harness/memory.py`), while a
  profiler (`sys.setprofile`) watches every Python call in this thread.
- An *effect* is a call that leaves the controller: into `workers/transport.py` (a worker's call on
  the wire) or into `persistence/` (a write or read of the desired state's store).
- The *path* is every frame under `rlcp/controlplane/` between the route handler and an effect: the
  handler's frames on the stack (stitched across asyncio tasks, each task to the stack that created
  it) each time an effect is entered, the effect's own frame last. Bookkeeping that reaches no
  effect (metrics, the record, the registry) is not on the path.
- A *stop* is where a reader of that path goes next: consecutive frames of one chain in the same
  module are one stop (a module's helpers are read with it), named `module:function` by the first;
  stops in the same module reached from the same stop are one stop (the executor run twice, a driver's
  check and its update, a fan-out to each worker). The stops form a tree, printed indented in the
  order control reaches them: the count is its number of nodes.
- A *return to a module already left* is a stop, in that order, whose module an earlier stop was in:
  a closure handed down and called back, a layer calling the one above it, or a second descent through
  modules already walked (a pre-check's own way to the workers beside the update's).

The bounds (issue 46's must-show): at most 12 stops and at most 3 returns, both ways an update runs
(all at once, rolling). The members are agents (the update in one call): stock vLLM's three calls
run only against real engines.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import rlcp.controlplane
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.api.routes import updates
from rlcp.core.body import BODY_HANDLER_ARGS
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import update_body
from rlcp.harness.memory import MemoryFleet

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(rlcp.controlplane.__file__).parent
ROOT = (PACKAGE / "api" / "routes" / "updates.py", "post_update_weights")
EFFECTS = (str(PACKAGE / "workers" / "transport.py"), str(PACKAGE / "persistence") + "/")
MAX_STOPS, MAX_RETURNS = 12, 3


def module_of(frame: FrameType) -> str | None:
    """The frame's module under `rlcp/controlplane/` (`operations.weights`), or None outside it."""
    path = Path(frame.f_code.co_filename)
    if not path.is_relative_to(PACKAGE):
        return None
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


@dataclass
class Stop:
    module: str
    function: str
    children: list[Stop] = field(default_factory=list)

    functions: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.module}:{', '.join([self.function, *self.functions])}"

    def child(self, module: str, function: str) -> Stop:
        for c in self.children:
            if c.module == module:
                if function != c.function and function not in c.functions:
                    c.functions.append(function)
                return c
        made = Stop(module, function)
        self.children.append(made)
        return made

    def walk(self, depth: int = 0) -> Iterator[tuple[int, Stop]]:
        """Each stop with its depth, in the order control reaches it."""
        yield depth, self
        for c in self.children:
            yield from c.walk(depth + 1)


class PathTracer:
    """Records the stitched stack at every effect entered below the route handler."""

    def __init__(self) -> None:
        self.chains: list[list[FrameType]] = []
        self._created_by: dict[asyncio.Task[Any], list[FrameType]] = {}

    def stack(self, frame: FrameType | None) -> list[FrameType]:
        """`frame`'s stack, outermost first, the task that runs it continued by the stack that created it."""
        frames: list[FrameType] = []
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        frames.reverse()
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        return [*self._created_by.get(task, []), *frames] if task is not None else frames

    def task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kw)
        self._created_by[task] = self.stack(sys._getframe(1))
        return task

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(EFFECTS):
            return
        if frame.f_back is not None and frame.f_back.f_code.co_filename.startswith(EFFECTS):
            return  # inside an effect already
        chain = self.stack(frame)
        roots = [i for i, f in enumerate(chain) if (Path(f.f_code.co_filename), f.f_code.co_name) == ROOT]
        if roots:
            self.chains.append(chain[roots[0] :])

    def path(self) -> Stop:
        """The stops, as a tree rooted at the handler's."""
        root = Stop(*_label(self.chains[0][0]))
        for chain in self.chains:
            here = root
            for frame in chain[1:]:
                module = module_of(frame)
                if module is None or module == here.module:
                    continue
                here = here.child(*_label(frame))
        return root


def _label(frame: FrameType) -> tuple[str, str]:
    module = module_of(frame)
    assert module is not None
    return module, frame.f_code.co_qualname.replace(".<locals>", "")


@dataclass
class Counted:
    stops: int
    returns: int
    lines: list[str]


async def walk_one_update(tmp_path: Path, fleet: MemoryFleet, body: dict[str, Any]) -> Counted:
    ctl = fleet.controller(tmp_path)
    await ctl.refresh()
    app = web.Application(handler_args=BODY_HANDLER_ARGS)
    updates.api.register(app)
    app[CONTROLLER] = ctl
    async with TestClient(TestServer(app)) as client:
        tracer = PathTracer()
        loop = asyncio.get_running_loop()
        loop.set_task_factory(tracer.task_factory)
        sys.setprofile(tracer.profile)
        try:
            resp = await client.post("/v1/rl/update_weights", json=body)
            answer = await resp.json()
            await ctl.detached.close()  # the record's closing write, kept after the answer
        finally:
            sys.setprofile(None)
            loop.set_task_factory(None)
        assert resp.status == 200 and answer["status"] == "ok", answer
    root = tracer.path()
    lines, stops, returns, seen = [], 0, 0, set()
    for depth, stop in root.walk():
        returned = stop.module in seen
        seen.add(stop.module)
        stops += 1
        returns += returned
        lines.append("  " * depth + stop.name + ("   <- back in a module already left" if returned else ""))
    return Counted(stops, returns, lines)


@pytest.mark.parametrize("strategy", ["all_at_once", "rolling"])
async def test_one_disk_update_walks_a_short_path(tmp_path: Path, strategy: str) -> None:
    fleet = await MemoryFleet.start(2, roots=[tmp_path])
    try:
        path = tmp_path / "v1"
        write_checkpoint(path, 1)
        body = update_body("v1", path)
        if strategy == "rolling":
            body["strategy"] = {"type": "rolling", "max_unavailable": 1}
        counted = await walk_one_update(tmp_path, fleet, body)
    finally:
        await fleet.stop()
    print(f"\none disk update ({strategy}): {counted.stops} stops, {counted.returns} returns to a module already left")
    print("\n".join(counted.lines))
    # The path reaches the workers and the store (what it leaves out reaches neither).
    assert any(line.strip().startswith("workers.transport:") for line in counted.lines), counted.lines
    assert any(line.strip().startswith("persistence.") for line in counted.lines), counted.lines
    assert counted.stops <= MAX_STOPS and counted.returns <= MAX_RETURNS, "\n".join(counted.lines)

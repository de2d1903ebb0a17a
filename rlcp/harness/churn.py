"""A fleet whose membership changes while a run goes on: the changes as data, applied at step boundaries.

The local fleet (`--churn 5:join,8:kill,10:leave`) and the elastic run's test share this. The
members are served as a `GET /v1/rl/workers` listing (`ListingServer`, aiohttp on loopback, port
0; the controller discovers them with `discovery.kind: http_listing`), so changing the listing is
how a member joins or leaves, as an operator's autoscaler or Dynamo's frontend would change it.

    parse_churn   "5:join,8:kill=agent-0,10:leave" -> [ChurnEvent]   (pure; ValueError says why)
    check_churn   a plan against the fleet's size and the run's steps  (pure; ValueError says why)
    Churn.on_step(k)   starts step k's events as named tasks; training never waits for them
        join   start a new agent, list it once it serves (the controller converges it first)
        leave  unlist a member, wait for the controller to drop it, stop it (if this run owns it)
        kill   SIGKILL a member's processes and unlist it at once (the process is gone: its
               supervisor sees that), start it again and list it once it serves (a new instance)
    Churn.on_push(k)   step k's push opened its round (the trainer's thread): its crashes strike
        crash  a kill in the middle of the broadcast: the round has started, no tensor has moved;
               returns once the member is dead and unlisted, so the broadcast meets a dead rank
    Churn.landed()   the changes that reached the listing since the last call, for the step record

Events on one member run in order (a kill after a join waits for the join); on different
members they overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, cast, get_args

from aiohttp import web

from rlcp.controlplane.discovery.http_listing import render_listing
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.processes import AgentProcess
from rlcp.harness.supervisor import ProcessSupervisor

ChurnAction = Literal["join", "leave", "kill", "crash"]
ACTIONS: tuple[str, ...] = get_args(ChurnAction)


@dataclass(frozen=True)
class ChurnEvent:
    """At the end of step `step` (a crash: during its push), `action` on `target` (None: a new agent
    for a join, the newest member for a leave, a kill or a crash)."""

    step: int
    action: ChurnAction
    target: str | None = None

    def __str__(self) -> str:
        return f"{self.step}:{self.action}" + (f"={self.target}" if self.target else "")


def parse_churn(text: str) -> list[ChurnEvent]:
    """`STEP:ACTION[=MEMBER],...` in step order; a ValueError names the bad item and why."""
    events = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        step, sep, rest = item.partition(":")
        action, _, target = rest.partition("=")
        if not sep or not step.strip().isdigit() or int(step) < 1:
            raise ValueError(f"{item!r}: expected STEP:ACTION with STEP a step number >= 1 (e.g. 5:join)")
        if action not in ACTIONS:
            raise ValueError(f"{item!r}: unknown action {action!r} (known: {', '.join(ACTIONS)})")
        if action == "join" and target:
            raise ValueError(f"{item!r}: a join starts a new agent and takes no member")
        events.append(ChurnEvent(int(step), cast(ChurnAction, action), target or None))  # one of ACTIONS: checked
    if not events:
        raise ValueError("no events (expected e.g. 5:join,8:kill,10:leave)")
    return sorted(events, key=lambda e: e.step)


def check_churn(events: Sequence[ChurnEvent], members: Sequence[str], steps: int, prefix: str = "agent-") -> list[str]:
    """The members the plan ends with. Every event before the last step (one that lands after the
    run is not in it); a leave or a kill names a member there is at that point; at least one member
    stays. Joins are named `<prefix><n>` after the highest such name."""
    names = list(members)
    nxt = _next_index(names, prefix)
    for e in events:
        if e.step >= steps:
            raise ValueError(f"{e}: the run has {steps} steps; a change after step {steps - 1} lands in none")
        if e.action == "join":
            names.append(f"{prefix}{nxt}")
            nxt += 1
            continue
        target = e.target or names[-1]
        if target not in names:
            raise ValueError(f"{e}: no member {target!r} then (members: {', '.join(names)})")
        if e.action == "leave":
            if len(names) == 1:
                raise ValueError(f"{e}: the last member cannot leave")
            names.remove(target)
    return names


def _next_index(names: Sequence[str], prefix: str) -> int:
    numbers = (n.removeprefix(prefix) for n in names if n.startswith(prefix))
    return 1 + max((int(n) for n in numbers if n.isdigit()), default=-1)


class ListingServer:
    """The members as a `GET /v1/rl/workers` listing on loopback (port 0)."""

    def __init__(self, *, namespace: str = "local-fleet") -> None:
        self.specs: dict[str, WorkerSpec] = {}
        self.namespace = namespace
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/rl/workers", self._listing)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1/rl/workers"
        return self.url

    async def _listing(self, request: web.Request) -> web.Response:
        return web.json_response(render_listing(list(self.specs.values()), namespace=self.namespace))

    def list(self, spec: WorkerSpec) -> None:
        self.specs[spec.id] = spec

    def unlist(self, member: str) -> None:
        self.specs.pop(member, None)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


# A crash waits at most this for its member to be dead and unlisted (a SIGKILL and a listing edit;
# a join of the same member still starting comes first, and has its own deadline).
_CRASH_S = 900.0


@dataclass
class _Applying:
    """An event under way: `killed` is set once a kill or crash has struck (or failed to)."""

    killed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Landed:
    """A change as it reached the listing: after the end of step `step`, `seconds` later."""

    step: int
    what: str  # "join agent-2", "kill agent-0", "restart agent-0", "leave agent-2"
    seconds: float


# Starts the agent called `name` (the `index`-th this run started) and returns it once it serves.
StartAgent = Callable[[str, int], Awaitable[AgentProcess]]
# Returns once the controller no longer lists `member` (a deadline is the callee's).
Dropped = Callable[[str], Awaitable[None]]


class Members(Protocol):
    """How a plan's changes reach one kind of fleet. Each call returns once its change has landed
    where the controller looks (a deadline is the implementation's); `Churn` times and says them."""

    async def join(self, name: str, index: int) -> None:
        """A new member `name` (the `index`-th this run started), in the fleet."""

    async def leave(self, name: str) -> None:
        """`name` out of the fleet (what the controller reads no longer has it)."""

    async def retire(self, name: str) -> None:
        """After `leave`: whatever stops a member that left (the controller dropped it first)."""

    async def kill(self, name: str) -> None:
        """`name`'s processes SIGKILLed (and, where discovery is ours, unlisted)."""

    async def restart(self, name: str) -> None:
        """After `kill`: `name` back as a new instance, in the fleet."""


@dataclass
class ListedMembers:
    """Members as this run's agent processes, served as a listing (`ListingServer`)."""

    listing: ListingServer
    agents: dict[str, AgentProcess]  # the members this run started (and may stop), by id
    start_agent: StartAgent
    dropped: Dropped
    supervisor: ProcessSupervisor | None = None  # kept away from a member while it is killed here
    down_on_purpose: set[str] = field(default_factory=set)  # members down by our hand (left; killed, until back)
    on_restart: Callable[[AgentProcess], None] = lambda child: None  # told each killed member's new process

    def names(self) -> list[str]:
        return list(self.listing.specs)

    async def join(self, name: str, index: int) -> None:
        child = await self.start_agent(name, index)
        self.agents[name] = child
        if self.supervisor is not None and child not in self.supervisor.children:  # kept up as the first ones
            self.supervisor.children.append(child)
        self.listing.list(WorkerSpec(**child.spec(name)))

    async def leave(self, name: str) -> None:
        self.listing.unlist(name)

    async def retire(self, name: str) -> None:
        await self.dropped(name)
        if name in self.agents:  # a member this run started: stopped; another one is only unlisted
            child = self.agents.pop(name)
            self._unsupervise(child)
            self.down_on_purpose.add(name)
            await asyncio.to_thread(child.stop)

    async def kill(self, name: str) -> None:
        child = self.agents[name]
        self._unsupervise(child)
        self.down_on_purpose.add(name)
        await asyncio.to_thread(child.kill)
        self.listing.unlist(name)  # the process is gone: its supervisor sees that

    async def restart(self, name: str) -> None:
        child = self.agents[name]
        child.spawn()  # an agent comes back on the ports it had (AgentProcess.spawn)
        self.on_restart(child)
        await child.wait_ready_async()
        self.down_on_purpose.discard(name)
        if self.supervisor is not None:
            self.supervisor.children.append(child)
        self.listing.list(WorkerSpec(**child.spec(name)))

    def _unsupervise(self, child: AgentProcess) -> None:
        if self.supervisor is not None and child in self.supervisor.children:
            self.supervisor.children.remove(child)


@dataclass
class Churn:
    """Applies `events` to the fleet through `members`; see the module docstring."""

    events: Sequence[ChurnEvent]
    members: Members
    order: list[str]  # the members at the start, oldest first (joins are appended as they start)
    started: int = 0  # agents this run started already (a joiner's index counts on from it)
    say: Callable[[str], None] = print
    prefix: str = "agent-"  # joiners are named <prefix><n>
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    history: list[Landed] = field(default_factory=list)
    _undrained: int = 0
    _busy: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _next: int = 0  # joins are named agent-<n> after the highest such name so far (as check_churn)
    _crashed: set[int] = field(default_factory=set)  # steps whose crashes struck
    _loop: asyncio.AbstractEventLoop | None = None  # the loop the events run on (on_push comes from a thread)

    @classmethod
    def listed(
        cls,
        events: Sequence[ChurnEvent],
        members: ListedMembers,
        *,
        say: Callable[[str], None] = print,
        prefix: str = "agent-",
    ) -> Churn:
        """A plan over a listed fleet, starting from the listing as it is."""
        return cls(events, members, members.names(), started=len(members.agents), say=say, prefix=prefix)

    def __post_init__(self) -> None:
        with contextlib.suppress(RuntimeError):  # made outside a loop: on_push has nothing to strike on
            self._loop = asyncio.get_running_loop()
        self.order = list(self.order)
        self._next = _next_index(self.order, self.prefix)

    def on_step(self, step: int) -> None:
        """Step `step` ended: start its events (never waited for here; its crashes struck in its push)."""
        for e in (e for e in self.events if e.step == step and e.action != "crash"):
            self._start(e)

    def on_push(self, step: int) -> None:
        """Step `step`'s push opened its round; called from the trainer's thread, as the round's
        broadcast waits. Its crashes strike now (once per step, whatever re-forms follow), and this
        returns once each crashed member is dead; their restarts go on without it."""
        crashes = [e for e in self.events if e.step == step and e.action == "crash"]
        if not crashes or step in self._crashed or self._loop is None:
            return
        self._crashed.add(step)

        async def strike() -> None:
            for e in crashes:
                await self._start(e).killed.wait()

        asyncio.run_coroutine_threadsafe(strike(), self._loop).result(timeout=_CRASH_S)

    def landed(self) -> list[str]:
        """The changes that reached the fleet since the last call."""
        new, self._undrained = self.history[self._undrained :], len(self.history)
        return [f"{c.what} (+{c.seconds:.0f}s)" for c in new]

    async def finish(self) -> None:
        """Every event started so far, done (its errors raised)."""
        await asyncio.gather(*self.tasks)

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _start(self, e: ChurnEvent) -> _Applying:
        if e.action == "join":
            target = f"{self.prefix}{self._next}"
            self._next += 1
            self.order.append(target)
        else:
            target = e.target or self.order[-1]
            if e.action == "leave":
                self.order.remove(target)
        before = self._busy.get(target)
        applying = _Applying()
        task = asyncio.create_task(self._apply(e, target, before, applying), name=f"churn-{e.step}-{e.action}-{target}")
        self._busy[target] = task
        self.tasks.append(task)
        return applying

    def _land(self, e: ChurnEvent, what: str, t0: float) -> None:
        self.history.append(Landed(e.step, what, time.monotonic() - t0))
        when = f"in step {e.step}'s push" if e.action == "crash" else f"after step {e.step}"
        since = "the round opened" if e.action == "crash" else "the step ended"
        self.say(f"  churn {when}: {what} ({time.monotonic() - t0:.1f}s after {since})")

    async def _apply(self, e: ChurnEvent, target: str, before: asyncio.Task[None] | None, applying: _Applying) -> None:
        try:
            if before is not None:
                with contextlib.suppress(Exception):  # its failure is raised by its own task
                    await before
            await self._applying(e, target, applying)
        finally:
            applying.killed.set()  # whatever failed (raised by this task), a crash's push goes on

    async def _applying(self, e: ChurnEvent, target: str, applying: _Applying) -> None:
        t0 = time.monotonic()
        if e.action == "join":
            self.say(f"  churn after step {e.step}: starting {target} to join")
            self.started += 1
            await self.members.join(target, self.started - 1)
            self._land(e, f"join {target}", t0)
        elif e.action == "leave":
            await self.members.leave(target)
            self._land(e, f"leave {target}", t0)
            await self.members.retire(target)
        else:
            await self.members.kill(target)
            self._land(e, f"{e.action} {target}", t0)
            applying.killed.set()  # a crash's round goes on now; the restart, without it
            await self.members.restart(target)
            self._land(e, f"restart {target}", t0)

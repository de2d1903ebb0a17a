"""`SimEngine`'s scheduler: request queues, stepping, and vLLM 0.32's pause states.

It decides which requests run and when each gets its next token; what that token is (a hash
of the weights and adapter the engine holds) is the engine's, passed in as `emit`. One
sleeping task per engine steps every running request each `token_interval_s`, and sleeps
while nothing can step, so hundreds of idle engines cost nothing.

pause("wait") drains *running* requests only: requests still queued stay waiting until
resume (vLLM's PAUSED_NEW admits no queued request); under a keep pause (PAUSED_ALL) nothing
steps and every request counts as frozen, as `VllmEngine` reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Literal

from rlcp.agent.engine.sim_lora import SimLora
from rlcp.core.wire.agent import PauseMode, RequestCounts

FinishReason = Literal["length", "abort"]
_Scheduling = Literal["run", "paused_new", "paused_all"]  # vLLM's PauseState


@dataclass
class SimOutput:
    request_id: str
    token_ids: list[int]  # all generated so far, like vLLM's CUMULATIVE output
    finished: bool = False
    finish_reason: FinishReason | None = None
    weight_versions: list[tuple[str, int, int]] = field(default_factory=list)  # (version, start, end)


@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_key: bytes
    max_tokens: int
    lora: SimLora | None
    chain: bytes  # digest of the tokens so far, so each step hashes O(1) bytes
    token_ids: list[int] = field(default_factory=list)
    versions: list[str | None] = field(default_factory=list)  # weight version of each token
    finished: bool = False
    latest: SimOutput | None = None
    error: BaseException | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def publish(self, reason: FinishReason | None = None) -> None:
        # Outputs are cumulative, so a slow consumer may skip snapshots (as vLLM's collector merges them).
        spans: list[tuple[str, int, int]] = []
        if reason is not None:
            for i, version in enumerate(self.versions):
                if version is None:
                    continue  # vLLM reports no span for unlabelled tokens
                if spans and spans[-1][0] == version and spans[-1][2] == i:
                    spans[-1] = (version, spans[-1][1], i + 1)
                else:
                    spans.append((version, i, i + 1))
        self.latest = SimOutput(self.request_id, list(self.token_ids), reason is not None, reason, spans)
        self.ready.set()


class SimScheduler:
    def __init__(self, *, max_running: int, token_interval_s: float, emit: Callable[[SimRequest], None]) -> None:
        self._max_running = max_running
        self._token_interval_s = token_interval_s
        self._emit = emit  # appends one token to a running request
        self._task: asyncio.Task[None] | None = None
        self._scheduling: _Scheduling = "run"
        self._requests: dict[str, SimRequest] = {}  # every in-flight request
        self._running: dict[str, SimRequest] = {}
        self._waiting: dict[str, SimRequest] = {}  # FIFO by insertion order
        self._work = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()

    def set_token_interval(self, seconds: float) -> None:
        self._token_interval_s = seconds

    # -- the stepping task --------------------------------------------------------------
    def start(self, name: str) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._schedule_forever(), name=name)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()  # awaited by stop()

    async def stop(self) -> None:
        for req in list(self._requests.values()):
            self.finish(req, "abort")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _schedule_forever(self) -> None:
        while True:
            await self._work.wait()
            await asyncio.sleep(self._token_interval_s)
            self.step()

    def step(self) -> None:
        if self._scheduling == "paused_all":
            return
        if self._scheduling == "run":
            while self._waiting and len(self._running) < self._max_running:
                rid = next(iter(self._waiting))
                self._running[rid] = self._waiting.pop(rid)
        for req in list(self._running.values()):
            self._emit(req)
            if len(req.token_ids) >= req.max_tokens:
                self.finish(req, "length")
            else:
                req.publish()
        self._refresh()

    # -- requests -----------------------------------------------------------------------
    def in_flight(self, request_id: str) -> bool:
        return request_id in self._requests

    async def submit(self, req: SimRequest) -> AsyncGenerator[SimOutput, None]:
        """Queue `req` and yield its outputs until it finishes; a consumer leaving aborts it."""
        self._requests[req.request_id] = self._waiting[req.request_id] = req
        self._refresh()
        try:
            while True:
                await req.ready.wait()
                req.ready.clear()
                if req.error is not None:
                    raise req.error
                assert req.latest is not None
                yield req.latest
                if req.latest.finished:
                    return
        finally:
            if not req.finished:  # the consumer went away: vLLM aborts the request
                self.finish(req, "abort")

    def finish(self, req: SimRequest, reason: FinishReason) -> None:
        for table in (self._requests, self._running, self._waiting):
            table.pop(req.request_id, None)
        req.finished = True
        req.publish(reason)
        self._refresh()

    def abort(self, request_ids: list[str] | None) -> int:
        # Empty or None means all, as vLLM's /abort_requests does; the count is of requests found.
        targets = (
            [self._requests[r] for r in request_ids if r in self._requests]
            if request_ids
            else list(self._requests.values())
        )
        for req in targets:
            self.finish(req, "abort")
        return len(targets)

    def fail_all(self, error: BaseException) -> None:
        for req in self._requests.values():
            req.finished, req.error = True, error
            req.ready.set()
        self._requests, self._running, self._waiting = {}, {}, {}
        self._drained.set()  # wakes a wait-mode pause, which then sees the engine dead

    def has_running(self) -> bool:
        return bool(self._running)

    def counts(self) -> RequestCounts:
        if self._scheduling == "paused_all":
            return RequestCounts(frozen=len(self._requests))
        return RequestCounts(running=len(self._running), waiting=len(self._waiting))

    # -- pause states -------------------------------------------------------------------
    def pause(self, mode: PauseMode) -> None:
        if mode == "abort":
            for req in list(self._requests.values()):
                self.finish(req, "abort")
        self._scheduling = "paused_all" if mode == "keep" else "paused_new"
        self._refresh()

    async def drained(self) -> None:
        """Until no request runs: the end of a wait-mode pause (or the engine's death)."""
        await self._drained.wait()

    def resume(self) -> None:
        self._scheduling = "run"
        self._refresh()

    @property
    def pausing(self) -> bool:
        return self._scheduling != "run"

    def _refresh(self) -> None:
        """Re-derive the scheduler's wake-up and the wait-mode drain from the queues."""
        steppable = self._scheduling != "paused_all" and bool(
            self._running or (self._scheduling == "run" and self._waiting)
        )
        self._work.set() if steppable else self._work.clear()
        self._drained.clear() if self._running else self._drained.set()

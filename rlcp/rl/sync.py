"""The trainer's weights to every engine, through the controller: by broadcast or from disk.

- `BroadcastSync`: vLLM's own trainer-side weight-transfer engine
  (`WeightTransferTrainerFactory.trainer_init` + `send_weights`) with the controller as its
  `VLLMWeightSyncClient` (`rlcp.client.client.ControllerWeightSyncClient`): the trainer is
  rank 0 of one group with the whole fleet, broadcasts each tensor once, and the controller
  drives every engine through init / start / update / finish, verifies and resumes. The
  backend is this project's gloo one on CPU and vLLM's `nccl` on GPU; the code is the same.
  Each step's weights are also saved to disk and named to the controller as the version's
  checkpoint, so a worker that restarts on its base weights is converged by the reconciler.
  A fleet member that joined, left or restarted since the group formed makes the controller
  refuse the round (409 `membership_changed`, naming them): the push forms the group again
  with the current members and sends the same version in the same call, so a membership
  change never fails a push. A member killed mid-round fails the round before anyone can refuse
  it; the push then waits up to `change_wait_s` for discovery to unlist it, and re-forms the
  same way. It re-forms at most `MAX_REFORMS` times per push; a fleet that keeps moving fails it
  (`FleetKeptChanging`), naming every change.
- `DiskSync`: the weights saved as safetensors, then one `update_weights` call (the
  controller checks the checkpoint on every worker, pauses, loads, verifies and resumes;
  `max_unavailable` makes it a rolling update).

Both push whole weights and return when every engine serves them (or the controller said
which worker failed, and why).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

from rlcp.client.client import (
    ControllerWeightSyncClient,
    ControlPlaneClient,
    ControlPlaneClientError,
    RequestRejected,
)
from rlcp.core.wire.controller import MembershipDelta

log = structlog.get_logger("rlcp.rl.sync")
SyncKind = Literal["broadcast", "disk"]
# Groups one push may form again: one for the change that refused it, and one more for a change
# that lands while the group forms again (a scale-up adding workers one discovery report at a
# time). Past that the fleet moves faster than a round takes, and retrying could loop for ever.
MAX_REFORMS = 2


@dataclass(frozen=True)
class Pushed:
    """One push: how long it took, what went wrong (None when every engine took it), and the
    membership changes it formed the group again for (in order; empty when none)."""

    version: str
    seconds: float
    error: str | None = None
    reformed_for: tuple[MembershipDelta, ...] = ()


class FleetKeptChanging(RuntimeError):
    """The fleet's membership changed more than `MAX_REFORMS` times during one push."""

    def __init__(self, version: str, changes: list[MembershipDelta]) -> None:
        named = " | ".join(c.describe() for c in changes)
        super().__init__(
            f"the fleet's membership changed {len(changes)} times while pushing {version} "
            f"(at most {MAX_REFORMS} re-forms per push): {named}"
        )
        self.changes = changes


class TrainerEngine(Protocol):
    """What a push needs of a trainer-side weight-transfer engine: vLLM's `TrainerWeightTransferEngine`
    as this project's gloo backend and vLLM's `nccl` one implement it."""

    def send_weights(self, weight_version: str | None = None) -> None: ...

    def shutdown(self) -> None: ...


# Joins a new group with the fleet as rank 0 through the client and returns the trainer's engine:
# (client, the trainer's world size as the controller gave it, the model).
JoinGroup = Callable[[ControllerWeightSyncClient, int, Any], TrainerEngine]


class WeightSync(Protocol):
    async def push(self, model: Any, version: str) -> Pushed: ...

    async def close(self) -> None: ...


def free_port(host: str) -> int:
    """A port free on `host` now: the group's rendezvous, which the trainer (rank 0) hosts."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def save_weights(model: Any, out: Path) -> Path:
    """`model`'s weights (and config) as safetensors in `out`, as the engines load them."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per save would bury the step lines
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out


@dataclass
class DiskSync:
    """Save, then one `update_weights` call on the controller."""

    client: ControlPlaneClient
    steps_dir: Path
    max_unavailable: int | str | None = None  # a rolling update, wave by wave
    timeout_s: float = 300.0

    async def push(self, model: Any, version: str) -> Pushed:
        t0 = time.monotonic()
        path = await asyncio.to_thread(save_weights, model, self.steps_dir / version)
        try:
            await self.client.update_weights(
                version, str(path), pause_mode="keep", timeout_s=self.timeout_s, max_unavailable=self.max_unavailable
            )
        except ControlPlaneClientError as exc:
            return Pushed(version, time.monotonic() - t0, str(exc))
        return Pushed(version, time.monotonic() - t0)

    async def close(self) -> None:
        pass


@dataclass
class BroadcastSync:
    """vLLM's trainer engine, rank 0 of a group with the fleet; the controller is its client."""

    url: str
    token: str | None
    steps_dir: Path | None  # where each step's disk copy goes (None: no copy; a restarted worker then waits)
    backend: Literal["gloo", "nccl"] = "gloo"
    master_address: str = "127.0.0.1"
    timeout_s: float = 300.0
    # After a round that failed with no refusal (a member killed mid-broadcast), how long to wait for
    # discovery to show a member gone or new before the push fails: a listing's poll or a pod's
    # readiness probe, seconds. 0: fail at once.
    change_wait_s: float = 30.0
    # Told each round's version once the fleet has opened the round, in the trainer's thread, before
    # any tensor moves: where a chaos plan strikes mid-broadcast (the local fleet's `crash`).
    round_started: Callable[[str], None] | None = None
    # How the trainer joins a group: None for vLLM's trainer engine on `backend`; a test seam for a
    # fleet whose engines take no collective (SimEngine), as `rlcp.harness.sim_trainer` does.
    join: JoinGroup | None = None
    _engine: TrainerEngine | None = field(default=None, repr=False)
    _client: ControllerWeightSyncClient | None = field(default=None, repr=False)

    async def push(self, model: Any, version: str) -> Pushed:
        t0 = time.monotonic()
        if self.steps_dir is not None:
            path = await asyncio.to_thread(save_weights, model, self.steps_dir / version)
        changes: list[MembershipDelta] = []
        try:
            # vLLM's trainer engine is blocking (it waits on the broadcast and on the client's calls).
            await asyncio.to_thread(self._send, model, version, None if self.steps_dir is None else str(path), changes)
        except (ControlPlaneClientError, RuntimeError, OSError) as exc:
            await asyncio.to_thread(self._drop)  # the group is gone on both sides: the next push joins a new one
            return Pushed(version, time.monotonic() - t0, f"{type(exc).__name__}: {exc}", tuple(changes))
        return Pushed(version, time.monotonic() - t0, reformed_for=tuple(changes))

    def _send(self, model: Any, version: str, checkpoint: str | None, changes: list[MembershipDelta]) -> None:
        """One round of `version`; a round the controller refused for a membership change is sent
        again through a group formed with the current members (each change lands in `changes`)."""
        while True:
            try:
                if self._engine is None:
                    self._engine = self._init(model)
                assert self._client is not None
                started = None if self.round_started is None else functools.partial(self.round_started, version)
                self._client.begin_round(checkpoint, after_start=started)
                self._engine.send_weights(weight_version=version)
                return
            except Exception as exc:
                # A 409 raised in this thread, or the collective's own error after the controller
                # refused a call made beside it: either way the client kept the change. A member
                # that died mid-round was refused by no one: its discovery tells, a moment later.
                if self._client is None or (change := self._client.membership_change or self._died(exc)) is None:
                    raise
                changes.append(change)
                self._drop()  # this side's rank 0 of the stale group goes too
                if len(changes) > MAX_REFORMS:
                    raise FleetKeptChanging(version, changes) from exc
                log.info("weight_transfer_group_reforming", version=version, reform=len(changes), **change.model_dump())

    def _died(self, exc: Exception) -> MembershipDelta | None:
        """The change behind a round that failed on its own (the collective broke, or a worker
        failed its part), if discovery shows one within `change_wait_s`. A refusal (4xx) is an
        answer, not a death: it fails the push at once."""
        if self._client is None or isinstance(exc, RequestRejected) or self.change_wait_s <= 0:
            return None
        log.info("weight_transfer_round_failed_awaiting_membership", error=f"{type(exc).__name__}: {exc}")
        # This side's rank 0 goes first: the live ranks, still in the broadcast, then fail at once
        # (their peer closed) instead of at the collective's timeout, and the controller can close
        # the round.
        self._shutdown_engine()
        return self._client.await_membership_change(self.change_wait_s)

    def _init(self, model: Any) -> TrainerEngine:
        """Join a new group with the fleet (the controller assigns the engines' ranks)."""
        self._client = ControllerWeightSyncClient(self.url, token=self.token, timeout_s=self.timeout_s)
        world_size = self._client.trainer_world_size()
        return (self.join or self._join_vllm)(self._client, world_size, model)

    def _join_vllm(self, client: ControllerWeightSyncClient, world_size: int, model: Any) -> TrainerEngine:
        from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

        port = free_port(self.master_address)
        if self.backend == "gloo":
            from rlcp.agent.weight_transfer.cpu_gloo import GlooTrainerInitInfo, register

            register()  # a trainer process runs no vLLM plugins
            info: Any = GlooTrainerInitInfo(
                master_address=self.master_address, master_port=port, world_size=world_size, timeout_s=120.0, rank=0
            )
        else:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            info = NCCLTrainerInitInfo(
                master_address=self.master_address, master_port=port, world_size=world_size, rank=0
            )
        log.info("weight_transfer_group_joining", backend=self.backend, world_size=world_size, port=port)
        engine: TrainerEngine = WeightTransferTrainerFactory.trainer_init(
            info, client=client, source=ModuleSource(model)
        )
        return engine

    def _drop(self) -> None:
        self._shutdown_engine()
        client, self._client = self._client, None
        if client is not None:
            _quietly(client.close)

    def _shutdown_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            _quietly(engine.shutdown)

    async def close(self) -> None:
        await asyncio.to_thread(self._drop)


def _quietly(close: Callable[[], None]) -> None:
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - a half-dead group's teardown: nothing left to save
        log.warning("weight_transfer_teardown_failed", error=f"{type(exc).__name__}: {exc}")

"""The trainer's weights to every engine, through the controller: by broadcast or from disk.

- `BroadcastSync`: vLLM's own trainer-side weight-transfer engine
  (`WeightTransferTrainerFactory.trainer_init` + `send_weights`) with the controller as its
  `VLLMWeightSyncClient` (`rlcp.client.client.ControllerWeightSyncClient`): the trainer is
  rank 0 of one group with the whole fleet, broadcasts each tensor once, and the controller
  drives every engine through init / start / update / finish, verifies and resumes. The
  backend is this project's gloo one on CPU and vLLM's `nccl` on GPU; the code is the same.
  Each step's weights are also saved to disk and named to the controller as the version's
  checkpoint, so a worker that restarts on its base weights is converged by the reconciler.
- `DiskSync`: the weights saved as safetensors, then one `update_weights` call (the
  controller checks the checkpoint on every worker, pauses, loads, verifies and resumes;
  `max_unavailable` makes it a rolling update).

Both push whole weights and return when every engine serves them (or the controller said
which worker failed, and why).
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

from rlcp.client.client import ControllerWeightSyncClient, ControlPlaneClient, ControlPlaneClientError

log = structlog.get_logger("rlcp.rl.sync")
SyncKind = Literal["broadcast", "disk"]


@dataclass(frozen=True)
class Pushed:
    """One push: how long it took, and what went wrong (None when every engine took it)."""

    version: str
    seconds: float
    error: str | None = None


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
    _engine: Any = field(default=None, repr=False)
    _client: ControllerWeightSyncClient | None = field(default=None, repr=False)

    async def push(self, model: Any, version: str) -> Pushed:
        t0 = time.monotonic()
        if self.steps_dir is not None:
            path = await asyncio.to_thread(save_weights, model, self.steps_dir / version)
        try:
            # vLLM's trainer engine is blocking (it waits on the broadcast and on the client's calls).
            await asyncio.to_thread(self._send, model, version, None if self.steps_dir is None else str(path))
        except (ControlPlaneClientError, RuntimeError, OSError) as exc:
            await asyncio.to_thread(self._drop)  # the group is gone on both sides: the next push joins a new one
            return Pushed(version, time.monotonic() - t0, f"{type(exc).__name__}: {exc}")
        return Pushed(version, time.monotonic() - t0)

    def _send(self, model: Any, version: str, checkpoint: str | None) -> None:
        if self._engine is None:
            self._engine = self._init(model)
        assert self._client is not None
        self._client.checkpoint_path = checkpoint
        self._engine.send_weights(weight_version=version)

    def _init(self, model: Any) -> Any:
        """Join a new group with the fleet (the controller assigns the engines' ranks)."""
        from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

        self._client = ControllerWeightSyncClient(self.url, token=self.token, timeout_s=self.timeout_s)
        world_size = self._client.trainer_world_size()
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
        return WeightTransferTrainerFactory.trainer_init(info, client=self._client, source=ModuleSource(model))

    def _drop(self) -> None:
        engine, client, self._engine, self._client = self._engine, self._client, None, None
        for close in ((engine.shutdown if engine is not None else None), (client.close if client else None)):
            if close is None:
                continue
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - a half-dead group's teardown: nothing left to save
                log.warning("weight_transfer_teardown_failed", error=f"{type(exc).__name__}: {exc}")

    async def close(self) -> None:
        await asyncio.to_thread(self._drop)

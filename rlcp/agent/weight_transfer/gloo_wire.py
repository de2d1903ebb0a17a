"""The `gloo` weight-transfer backend's wire (`cpu_gloo`): one gloo process group, and the
tensors broadcast through it in buffers both sides cut from the same metadata, so they agree
without exchanging a word. Rank 0 sends (`send_tensors`), every worker receives
(`receive_tensors`), a few broadcasts in flight on each side. It knows nothing of vLLM's engine
or trainer classes; `bench/broadcast.py` measures it alone."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from itertools import chain
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta

# Packed tensors start at aligned offsets so the receiver can view them in place.
_ALIGN_BYTES = 64
# Broadcasts in flight per side: the next buffer moves while the last one is loaded (`nccl`'s
# `packed_num_buffers`, whose default is also 2).
DEFAULT_IN_FLIGHT = 2


class GlooGroup:
    """A gloo group on a `StatelessProcessGroup` store: stateless, as nccl's is, because
    the engine's workers already belong to a global group of their own."""

    def __init__(self, *, master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float) -> None:
        from torch.distributed import PrefixStore
        from vllm.distributed.utils import StatelessProcessGroup, init_gloo_process_group

        try:
            # Rank 0 hosts the TCPStore and waits there for every other rank; the others
            # retry connecting until the timeout. Either way no rank waits forever.
            self._store_group = StatelessProcessGroup.create(
                host=master_address,
                port=master_port,
                rank=rank,
                world_size=world_size,
                store_timeout=math.ceil(timeout_s),
            )
            self._pg = init_gloo_process_group(
                PrefixStore("rlcp-gloo-transfer", self._store_group.store),
                rank,
                world_size,
                timedelta(seconds=timeout_s),
            )
        except Exception as exc:  # torch raises several store and gloo error types: one cause
            raise RuntimeError(
                f"gloo weight transfer: rank {rank} of {world_size} could not join "
                f"{master_address}:{master_port} within {timeout_s:g}s: {exc}"
            ) from exc

    def broadcast(self, wire: torch.Tensor) -> Any:
        return self._pg.broadcast(wire, 0)

    def close(self) -> None:
        self._pg.shutdown()


def _nbytes(meta: ParamMeta) -> int:
    return int(math.prod(meta.shape) * meta.dtype.itemsize)


def plan_buffers(metas: list[ParamMeta], limit: int) -> list[list[tuple[ParamMeta, int]]]:
    """Cut the tensors, in order, into broadcasts of `(tensor, byte offset)`: one of `limit`
    bytes or more travels alone, straight from and into its own memory; smaller ones share a
    buffer. Both sides cut from the same metadata, so they agree without exchanging a word."""
    buffers: list[list[tuple[ParamMeta, int]]] = []
    used = limit  # no buffer open yet
    for meta in metas:
        size, offset = _nbytes(meta), -(-used // _ALIGN_BYTES) * _ALIGN_BYTES
        if not buffers or size >= limit or offset + size > limit:
            buffers.append([])
            offset = 0
        buffers[-1].append((meta, offset))
        used = limit + 1 if size >= limit else offset + size  # a large tensor closes its buffer
    return buffers


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


def _wire(buffer: list[tuple[ParamMeta, int]]) -> torch.Tensor:
    meta, offset = buffer[-1]
    return torch.empty(offset + _nbytes(meta), dtype=torch.uint8, device="cpu")


def _hold(*_kept: object) -> None:
    """A step's `done` that only keeps its buffers alive until they have been sent."""


def _pipelined(
    group: GlooGroup, steps: Iterator[tuple[torch.Tensor, Callable[[], None]]], in_flight: int = DEFAULT_IN_FLIGHT
) -> None:
    """Broadcast each step's wire buffer, running its `done` once it has moved; the next
    buffers are already on the wire meanwhile. An empty buffer is skipped on every rank."""
    pending: deque[tuple[Any, Callable[[], None]]] = deque()
    for step in chain(steps, [None]):
        if step is not None:
            wire, done = step
            pending.append((group.broadcast(wire) if wire.numel() else None, done))
        while pending and (step is None or len(pending) >= in_flight):
            work, done = pending.popleft()
            if work is not None:
                work.wait()
            done()


def send_tensors(
    group: GlooGroup,
    pairs: Iterator[tuple[str, torch.Tensor]],
    metas: list[ParamMeta],
    limit: int,
    in_flight: int = DEFAULT_IN_FLIGHT,
) -> None:
    """Rank 0: broadcast `pairs`, which must match `metas` (what the workers were told)."""

    def steps() -> Iterator[tuple[torch.Tensor, Callable[[], None]]]:
        for buffer in plan_buffers(metas, limit):
            tensors = [_checked(next(pairs, None), meta) for meta, _ in buffer]
            if len(buffer) == 1:
                wire = _as_bytes(tensors[0])
            else:
                wire = _wire(buffer)
                for tensor, (meta, offset) in zip(tensors, buffer, strict=True):
                    wire[offset : offset + _nbytes(meta)].copy_(_as_bytes(tensor))
            yield wire, partial(_hold, wire, tensors)

    _pipelined(group, steps(), in_flight)
    if (extra := next(pairs, None)) is not None:
        raise ValueError(f"the weight source yields more than its metadata declares; first extra: {extra[0]!r}")


def _checked(pair: tuple[str, torch.Tensor] | None, meta: ParamMeta) -> torch.Tensor:
    # The workers cut their buffers from the metadata: a tensor that differs from it would
    # shift every byte after it, so fail loudly instead of loading garbage.
    name, tensor = pair or ("(the end)", None)
    if tensor is None or name != meta.name or tensor.dtype != meta.dtype or tuple(tensor.shape) != meta.shape:
        got = name if tensor is None else f"{name!r} {tensor.dtype} {tuple(tensor.shape)}"
        raise ValueError(
            f"the weight source yields {got} where its metadata declares {meta.name!r} {meta.dtype} {meta.shape}"
        )
    return tensor


def receive_tensors(
    group: GlooGroup,
    metas: list[ParamMeta],
    limit: int,
    load: Callable[[list[tuple[str, torch.Tensor]]], Any],
    in_flight: int = DEFAULT_IN_FLIGHT,
) -> None:
    """A worker: receive the tensors `metas` names and hand them to `load` buffer by buffer,
    each freshly allocated (layerwise reloading may hold them until their layer is whole)."""

    def steps() -> Iterator[tuple[torch.Tensor, Callable[[], None]]]:
        for buffer in plan_buffers(metas, limit):
            if len(buffer) == 1:
                meta = buffer[0][0]
                tensor = torch.empty(meta.shape, dtype=meta.dtype, device="cpu")  # gloo's memory, not the GPU's
                wire, pairs = _as_bytes(tensor), [(meta.name, tensor)]
            else:
                wire = _wire(buffer)
                pairs = [
                    (meta.name, wire[offset : offset + _nbytes(meta)].view(meta.dtype).view(meta.shape))
                    for meta, offset in buffer
                ]
            yield wire, partial(load, pairs)

    _pipelined(group, steps(), in_flight)

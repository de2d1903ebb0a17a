"""`gloo`: a CPU weight-transfer backend for vLLM's weight-transfer protocol.

vLLM's broadcast backend (`nccl`) needs a GPU on every rank. This one moves the same bytes
over a gloo process group, so the broadcast path (trainer broadcasts, engines receive) runs
end to end with a real vLLM engine in CPU CI and on laptops. On GPUs use vLLM's `nccl`:
same protocol, same update-info keys.

Where it sits: the agent's admin routes pass `/init_weight_transfer_engine`,
`/start_weight_update`, `/update_weights` and `/finish_weight_update` through to vLLM,
whose worker builds the backend named by `weight_transfer_config.backend`. `register()` is
a `vllm.general_plugins` entry point, so every vLLM process knows `gloo` before its worker
builds that backend; the trainer side registers under the same name.

As with `nccl`: the trainer is rank 0 and hosts the rendezvous; each inference worker joins
at `rank_offset` + its global worker rank; init blocks until all `world_size` ranks have
joined, or fails after `timeout_s`. An update chunk names the tensors (names, dtypes,
shapes) and the trainer broadcasts them in that order, small ones packed into buffers.

`init_info` takes `nccl`'s wire keys too, with the same meaning, so a client written for
`nccl` (TRL sends `packed: true`) joins unchanged. In `nccl`, `packed` chooses the byte layout
of the broadcasts: false, one broadcast per tensor; true, tensors packed into buffers of
`packed_buffer_size_bytes`, `packed_num_buffers` of them in flight. Here the same: false sends
each tensor alone (a buffer size of one byte, below which no tensor fits), true packs them as
this module always has. `packed_buffer_size_bytes` is `nccl`'s name for `buffer_size_bytes`
(give one), and `packed_num_buffers` the broadcasts in flight per side, which does not change
the layout. Both sides cut the same layout because the trainer ships its own values to the
workers (`GlooTrainerWeightTransferEngine.trainer_init`), as `nccl`'s trainer does; a gloo
layout is not `nccl`'s, so only a gloo trainer sends to a gloo worker.

The bytes themselves (the group, the buffers cut from metadata alone, the pipelined
broadcasts) are `gloo_wire`'s; this module is what vLLM sees: the info types, the two
engines and their registration.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Self

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rlcp.agent.weight_transfer.gloo_wire import DEFAULT_IN_FLIGHT, GlooGroup, receive_tensors, send_tensors

BACKEND = "gloo"
DEFAULT_TIMEOUT_S = 300.0
# Tensors this large travel alone; smaller ones are packed up to this size. On loopback a
# broadcast costs ~0.1 ms, so 4 MiB makes that negligible while packing copies stay small.
DEFAULT_BUFFER_SIZE_BYTES = 4 * 1024 * 1024
# An unpacked transfer: every tensor of one byte or more is at least this size, so travels alone.
_UNPACKED_LIMIT = 1


@dataclass(kw_only=True)
class GlooWire:
    """The wire parameters both sides' init infos carry, with `nccl`'s keys (module docstring),
    checked alike; the trainer ships its own to the workers (`wire`), so both cut one layout."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    buffer_size_bytes: int | None = None
    packed: bool = True
    packed_buffer_size_bytes: int | None = None
    packed_num_buffers: int = DEFAULT_IN_FLIGHT

    def __post_init__(self) -> None:
        if not isinstance(self.packed, bool):
            raise ValueError(f"packed must be true or false; got {self.packed!r}")
        if self.buffer_size_bytes is not None and self.packed_buffer_size_bytes is not None:
            raise ValueError("give buffer_size_bytes or packed_buffer_size_bytes (nccl's name for it), not both")
        if self.timeout_s <= 0 or _buffer_size(self) <= 0 or self.packed_num_buffers <= 0:
            raise ValueError("timeout_s, the buffer size and packed_num_buffers must be positive")

    def wire(self) -> dict[str, Any]:
        """These parameters alone, as keywords."""
        return {f.name: getattr(self, f.name) for f in fields(GlooWire)}


@dataclass(kw_only=True)
class GlooWeightTransferInitInfo(WeightTransferInitInfo, GlooWire):
    """What an inference worker needs to join: the `init_info` of `/init_weight_transfer_engine`."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int

    def __post_init__(self) -> None:
        if not 0 < self.rank_offset < self.world_size:
            raise ValueError(f"rank_offset must be in [1, world_size); got {self.rank_offset}, {self.world_size}")
        super().__post_init__()


def _buffer_size(info: GlooWire) -> int:
    given = info.buffer_size_bytes if info.buffer_size_bytes is not None else info.packed_buffer_size_bytes
    return DEFAULT_BUFFER_SIZE_BYTES if given is None else given


def wire_limit(info: GlooWire) -> int:
    """The byte size at which a tensor travels alone (`plan_buffers`): the buffer size when
    packed, one byte (every tensor alone) when not."""
    return _buffer_size(info) if info.packed else _UNPACKED_LIMIT


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo, GlooWire):
    """Trainer side: rank 0 hosts the rendezvous at master_address:master_port."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: the `update_info` of `/update_weights`, same keys as vLLM's `nccl`."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )

    @classmethod
    def from_metadata(cls, meta: list[ParamMeta]) -> Self:
        return cls(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )

    def metadata(self) -> list[ParamMeta]:
        if bad := [d for d in self.dtype_names if not isinstance(getattr(torch, d, None), torch.dtype)]:
            raise ValueError(f"unknown dtype names: {sorted(set(bad))}")
        return [
            ParamMeta(name, getattr(torch, dtype), tuple(shape))
            for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes, strict=True)
        ]


# -- engine side (runs in vLLM's worker) ---------------------------------------------------
class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    """Receives dense checkpoint-format weights over gloo and loads them as `nccl` does."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    _group: GlooGroup | None = None  # set by init_transfer_engine
    _limit = DEFAULT_BUFFER_SIZE_BYTES  # set by init_transfer_engine, as the trainer's
    _in_flight = DEFAULT_IN_FLIGHT

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        self.shutdown()  # a trainer that restarts joins a fresh group
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self._limit, self._in_flight = wire_limit(init_info), init_info.packed_num_buffers
        self._group = GlooGroup(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank=init_info.rank_offset + worker_rank,
            world_size=init_info.world_size,
            timeout_s=init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class then calls torch.accelerator.synchronize(), which raises on a
        # CPU-only process; a gloo receive is complete once its wait() returns.
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            # The worker ends a failed session without finish, leaving layers on the meta
            # device: the next forward pass would kill the engine. Finishing puts them back
            # (old weights where none arrived). The group is out of step: init again.
            self.finish_weight_update()
            self.shutdown()
            raise
        if torch.accelerator.is_available():  # a GPU model copies from the CPU buffers asynchronously
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        if self._group is None:
            raise RuntimeError("gloo weight transfer is not initialized: call init_weight_transfer_engine first")
        with disable_mtp_completeness_check():
            receive_tensors(self._group, update_info.metadata(), self._limit, self.model.load_weights, self._in_flight)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None


# -- trainer side ------------------------------------------------------------------------------
class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Rank 0 of the group: drives the workers through `client` and broadcasts `source`."""

    init_info_cls = GlooTrainerInitInfo
    group: GlooGroup | None = None  # set by trainer_init on the sender
    limit = DEFAULT_BUFFER_SIZE_BYTES  # the layout's cut (`wire_limit`), shipped to the workers at init
    in_flight = DEFAULT_IN_FLIGHT

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient, source: WeightSource | None = None
    ) -> Self:
        if source is None:
            raise ValueError("gloo trainer weight transfer requires a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        engine.limit, engine.in_flight = wire_limit(init_info), init_info.packed_num_buffers
        if not engine.is_sender:
            return engine
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
            **init_info.wire(),
        )
        # Workers and rank 0 each block in init until the others join: call them beside it.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gloo-init") as exe:
            future = exe.submit(client.init_weight_transfer_engine, asdict(worker_info))
            engine.group = GlooGroup(
                master_address=init_info.master_address,
                master_port=init_info.master_port,
                rank=0,
                world_size=init_info.world_size,
                timeout_s=init_info.timeout_s,
            )
            future.result()
        return engine

    def send_weights(self, weight_version: str | None = None) -> None:
        """One full round: start, one chunk with every tensor, finish (naming the version)."""
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # stay in the trainer-side gathers (FSDP full_tensor)
                pass
            return
        assert self.group is not None, "trainer_init() must run before send_weights()"
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gloo-update")
        try:
            # The workers receive inside update_weights, so the call runs beside the broadcast.
            future = exe.submit(self.client.update_weights, asdict(GlooWeightTransferUpdateInfo.from_metadata(meta)))
            send_tensors(self.group, iter(self.source), meta, self.limit, self.in_flight)
            future.result()
        finally:
            # Never join a worker call stuck in a broadcast that failed on this side: the
            # gloo timeout ends it, and the caller gets this side's error now.
            exe.shutdown(wait=False)
        self.client.finish_weight_update(weight_version)

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def register() -> None:
    """The `vllm.general_plugins` entry point: make `gloo` a backend in this process.
    Idempotent: a trainer process that calls it itself may also have run vLLM's plugins."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, class_name in (
        (WeightTransferEngineFactory, "GlooWeightTransferEngine"),
        (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine"),
    ):
        if BACKEND not in factory._registry:  # register_engine raises on a second registration
            factory.register_engine(BACKEND, __name__, class_name)

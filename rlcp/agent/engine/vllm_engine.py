"""`VllmEngine`: the Engine seam over a vLLM AsyncLLM running in the agent's process.

The only place (with `vllm_inference`) that imports vllm. Every vLLM failure is
translated to `EngineError` here, so the agent's operations see one error type.

Notes from vLLM 0.32's behaviour that shape this adapter:
- `reload_weights` (collective RPC) reloads in place but does not reset the prefix
  cache; the agent does that (`WeightState.commit`).
- vLLM's HTTP LoRA unload only drops a name from the serving table; `remove_lora`
  is what frees the adapter in the engine, and we keep the serving table in step.
- Keep-mode pauses leave requests inside the engine: they are counted as frozen.
- `AsyncLLM.sleep(level, mode)` pauses the scheduler (`mode`) before releasing memory, and
  `wake_up` resumes it once fully awake; vLLM's `is_sleeping` is also true while merely
  paused, so whether the memory is asleep is tracked here from our own calls. The CPU build
  accepts sleep and wake_up and ignores them ("sleep mode is not supported on CPU, ignore
  it"): the scheduler is paused and resumed, the weights never leave memory.
- `compute_weight_checksums` covers the base weights only; the adapters the engine holds are
  hashed in its workers by `vllm_worker.AdapterChecksumsExtension`, installed as vLLM's
  `worker_extension_cls`.
- On the CPU, `compute_weight_checksums` hashes empty tensors for every linear layer (their
  weights were moved into the CPU kernels); the same extension reads those weights back through
  the kernels and its digests replace the empty ones under the same keys
  (`vllm_kernel_weights`). A key still of no bytes afterwards is warned about once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, cast

import structlog

from rlcp.agent.engine.base import EngineError, EngineKind, TransferInfo
from rlcp.agent.engine.vllm_worker import (
    ADAPTER_CHECKSUMS_RPC,
    KERNEL_WEIGHT_CHECKSUMS_RPC,
    AdapterChecksumsExtension,
)
from rlcp.agent.settings import EngineSettings, InferenceSettings
from rlcp.core.wire.agent import EMPTY_TENSOR_SHA256, PauseMode, RequestCounts, lora_checksum_key
from rlcp.core.wire.server_info import ConfigFormat

log = structlog.get_logger("rlcp.agent.engine.vllm")
_WORKER_EXTENSION = f"{AdapterChecksumsExtension.__module__}.{AdapterChecksumsExtension.__qualname__}"


@asynccontextmanager
async def _engine_errors(what: str) -> AsyncIterator[None]:
    """Translate any vLLM failure of the primitive `what` into EngineError."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except EngineError:
        raise
    except Exception as exc:  # vLLM raises many types; the agent needs one
        raise EngineError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _stat_logger_factory(sink: dict[str, int]) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _QueueDepthLogger(StatLoggerBase):
        """Keeps the scheduler's last running/waiting counts for the agent's state."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:
                sink["waiting"] = scheduler_stats.num_waiting_reqs
                sink["running"] = scheduler_stats.num_running_reqs

        def log_engine_initialized(self) -> None:
            pass

    return _QueueDepthLogger


def build_vllm_args(engine: EngineSettings, inference: InferenceSettings) -> Any:
    """vLLM's own serve arguments, so its app and engine are configured as `vllm serve` would be."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = [
        "--model",
        engine.model,
        "--dtype",
        engine.dtype,
        "--gpu-memory-utilization",
        str(engine.gpu_memory_utilization),
        "--tensor-parallel-size",
        str(engine.tensor_parallel_size),
        "--host",
        inference.host,
        "--port",
        str(inference.port),
    ]
    if engine.served_model_name:
        argv += ["--served-model-name", engine.served_model_name]
    if engine.max_model_len:
        argv += ["--max-model-len", str(engine.max_model_len)]
    if engine.enforce_eager:
        argv.append("--enforce-eager")
    if engine.enable_lora:
        argv += ["--enable-lora", "--max-lora-rank", str(engine.max_lora_rank), "--max-loras", str(engine.max_loras)]
    if inference.tokens_in_tokens_out:
        # Without it vLLM mounts /inference/v1/generate answering 403 "Scale-out endpoints are disabled".
        argv.append("--enable-scale-out")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    for key, value in engine.extra_engine_args.items():
        if not hasattr(args, key):
            raise ValueError(f"engine.extra_engine_args: vLLM has no engine argument {key!r}")
        setattr(args, key, value)
    _install_worker_extension(args)
    return args


def _install_worker_extension(args: Any) -> None:
    """The workers must answer the adapter and kernel-weight checksums: add our extension, or
    check that one given in extra_engine_args carries it (vLLM takes a single extension class)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    given = getattr(args, "worker_extension_cls", "")
    if not given:
        args.worker_extension_cls = _WORKER_EXTENSION
    elif not issubclass(resolve_obj_by_qualname(given), AdapterChecksumsExtension):
        raise ValueError(
            f"engine.extra_engine_args.worker_extension_cls: {given!r} must subclass "
            f"{_WORKER_EXTENSION} (it hashes the adapters for the weight checksums)"
        )


class VllmEngine:
    kind: Final[EngineKind] = "vllm"

    def __init__(self, engine: EngineSettings, inference: InferenceSettings) -> None:
        self._settings = engine
        self._inference_settings = inference
        self._llm: Any = None
        self._inference: Any = None
        self.served_version: str | None = None
        self._queue_depth: dict[str, int] = {"running": 0, "waiting": 0}
        self._pause_mode: PauseMode | None = None
        self._warned_empty_checksums = False
        self._pausing = False  # between a pause (or sleep) call and the resume (or full wake)
        self._adapter_names: dict[int, str] = {}  # adapter id -> name, for the checksum keys
        self._asleep = False  # a fresh engine is awake; from then on, what our sleep / wake_up left

    @property
    def model_name(self) -> str:
        return self._settings.served_model_name or self._settings.model

    @property
    def model_dir(self) -> Path:
        """`engine.model`: a directory with the checkpoint the engine started from (or a
        model name vLLM resolves, where no directory is)."""
        return Path(self._settings.model)

    @property
    def inference_port(self) -> int | None:
        return self._inference.port if self._inference else None

    def is_alive(self) -> bool:
        return self._llm is not None and not self._llm.errored

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        from rlcp.agent.engine.vllm_inference import InferenceServer

        args = build_vllm_args(self._settings, self._inference_settings)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        self._llm = AsyncLLM.from_vllm_config(
            vllm_config=vllm_config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=[_stat_logger_factory(self._queue_depth)],
            enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=False,
        )
        self._inference = InferenceServer(
            self._llm,
            args,
            served_version=lambda: self.served_version,
            alive=self.is_alive,
            pausing=lambda: self._pausing,
        )
        await self._inference.start(self._inference_settings.host, self._inference_settings.port)
        log.info("vllm_engine_started", model=self.model_name, inference_port=self._inference.port)

    async def shutdown(self) -> None:
        if self._inference is not None:
            await self._inference.stop()
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    # -- generation control -----------------------------------------------------
    async def pause(self, mode: PauseMode) -> None:
        self._pausing = True  # from the call on: a wait-mode pause queues new requests while it drains
        async with _engine_errors("pause"):
            await self._llm.pause_generation(mode=mode)
        self._pause_mode = mode

    async def resume(self) -> None:
        async with _engine_errors("resume"):
            await self._llm.resume_generation()
        self._pause_mode = None
        self._pausing = False

    async def is_paused(self) -> bool:
        async with _engine_errors("is_paused"):
            return bool(await self._llm.is_paused())

    # -- sleep mode ---------------------------------------------------------------
    async def sleep(self, level: int, mode: PauseMode) -> None:
        self._pausing = True
        async with _engine_errors(f"sleep(level={level})"):
            await self._llm.sleep(level, mode)
        self._asleep = self._asleep or level >= 1  # level 0 only pauses scheduling
        self._pause_mode = mode

    async def wake_up(self, tags: list[str] | None) -> bool:
        async with _engine_errors("wake_up"):
            fully_awake = bool(await self._llm.wake_up(tags))
        if fully_awake:
            self._asleep = False
            self._pause_mode = None  # vLLM resumed scheduling
            self._pausing = False
        return fully_awake

    async def is_sleeping(self) -> bool:
        return self._asleep

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        async with _engine_errors("abort"):
            if request_ids:
                await self._llm.abort(request_ids)
                return len(request_ids)
            # As vLLM's /abort_requests does: every tracked request, by internal id.
            processor = self._llm.output_processor
            ids = [*processor.request_states.keys(), *processor.parent_requests.keys()]
            await self._llm.abort(ids, internal=True)
            return len(ids)

    def request_counts(self) -> RequestCounts:
        if self._llm is None:
            return RequestCounts()
        unfinished = self._llm.output_processor.get_num_unfinished_requests()
        if self._pause_mode == "keep":
            return RequestCounts(frozen=unfinished)
        # The scheduler's split lags by one step; the front end's total is exact.
        waiting = min(self._queue_depth["waiting"], unfinished)
        return RequestCounts(running=unfinished - waiting, waiting=waiting)

    # -- weights ------------------------------------------------------------------
    async def load_weights_from_disk(self, path: Path) -> None:
        async with _engine_errors("reload_weights"):
            await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})

    async def reset_prefix_cache(self, *, include_running: bool, external: bool = False) -> bool:
        async with _engine_errors("reset_prefix_cache"):
            return bool(
                await self._llm.reset_prefix_cache(reset_running_requests=include_running, reset_connector=external)
            )  # the route's reset_external

    async def set_weight_version(self, version: str) -> None:
        async with _engine_errors("update_weight_version"):
            await self._llm.update_weight_version(version)

    async def get_weight_version(self) -> str | None:
        async with _engine_errors("get_weight_version"):
            return cast("str | None", await self._llm.get_weight_version())

    async def weight_checksums(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        async with _engine_errors("compute_weight_checksums"):
            for worker in await self._llm.compute_weight_checksums():
                if duplicates := merged.keys() & worker.keys():
                    raise EngineError(f"duplicate weight checksum keys: {sorted(duplicates)[:5]}")
                merged.update(worker)
        merged |= await self._kernel_weight_checksums(merged)
        if not self._warned_empty_checksums and (empty := [k for k, v in merged.items() if v == EMPTY_TENSOR_SHA256]):
            # Parameters of no bytes that no kernel probe covered: those checksums cannot tell two
            # weight versions apart.
            self._warned_empty_checksums = True
            log.warning("weight_checksums_of_empty_tensors", empty=len(empty), tensors=len(merged), example=empty[0])
        if self._settings.enable_lora:
            merged |= await self._adapter_checksums()  # no base key starts with "lora:"
        return merged

    async def _kernel_weight_checksums(self, base: dict[str, str]) -> dict[str, str]:
        """The weights vLLM's CPU kernels hold, under the keys `base` gives empty digests (vllm_worker)."""
        async with _engine_errors("kernel_weight_checksums"):
            per_worker = await self._llm.collective_rpc(KERNEL_WEIGHT_CHECKSUMS_RPC)
        probed: dict[str, str] = {}
        for worker in per_worker:
            for key, digest in worker.items():
                if base.get(key) != EMPTY_TENSOR_SHA256 or key in probed:
                    # Each probe replaces one empty parameter: anything else means our names and
                    # vLLM's no longer match, and a silent extra key would mislead verification.
                    raise EngineError(f"kernel weight {key!r} is not an empty parameter of vLLM's checksums")
                probed[key] = digest
        return probed

    async def _adapter_checksums(self) -> dict[str, str]:
        """`lora:<name>:<rank prefix><tensor>` for every adapter the engine holds (vllm_worker)."""
        async with _engine_errors("adapter_checksums"):
            per_worker = await self._llm.collective_rpc(ADAPTER_CHECKSUMS_RPC)
        keyed: dict[str, str] = {}
        for worker in per_worker:
            for adapter_id, tensors in worker.items():
                # The engine may hold an adapter this agent did not name only if something else
                # loaded it; its id still keeps its keys apart (names cannot contain '#').
                name = self._adapter_names.get(int(adapter_id), f"#{adapter_id}")
                for tensor, digest in tensors.items():
                    key = lora_checksum_key(name, tensor)
                    if key in keyed:
                        raise EngineError(f"duplicate adapter checksum key {key!r}")
                    keyed[key] = digest
        return keyed

    async def reset_weights(self) -> None:
        async with _engine_errors("reset_weights"):
            await self._llm.collective_rpc("reset_weights")

    def world_size(self, include_dp: bool = True) -> int:
        parallel = self._llm.vllm_config.parallel_config
        return int(parallel.world_size_across_dp if include_dp else parallel.world_size)

    def server_config(self, config_format: ConfigFormat) -> dict[str, Any] | str:
        """What vLLM's own `/server_info` answers under `vllm_config`, from the same code."""
        config = self._llm.vllm_config
        if config_format == "text":
            return str(config)
        from pydantic import TypeAdapter
        from vllm.config import VllmConfig

        # fallback=str: torch.dtype and the like become strings, as vLLM's route makes them.
        dumped: dict[str, Any] = TypeAdapter(VllmConfig).dump_python(config, mode="json", fallback=str)
        return dumped

    # -- LoRA -----------------------------------------------------------------------
    async def add_lora(self, name: str, adapter_id: int, path: Path, *, replace: bool) -> None:
        from vllm.lora.request import LoRARequest

        request = LoRARequest(lora_name=name, lora_int_id=adapter_id, lora_path=str(path), load_inplace=replace)
        async with _engine_errors("add_lora"):
            if not await self._llm.add_lora(request):
                raise EngineError(f"engine refused adapter {name!r}")
        # Inference requests name the adapter as `model`; vLLM's server resolves it here.
        self._inference.state.openai_serving_models.lora_requests[name] = request
        self._adapter_names[adapter_id] = name

    async def remove_lora(self, name: str, adapter_id: int) -> None:
        self._inference.state.openai_serving_models.lora_requests.pop(name, None)
        async with _engine_errors("remove_lora"):
            # False means the engine did not hold it: vLLM evicts adapters on a weight
            # reload (a request naming one reloads it lazily). Removal is idempotent.
            await self._llm.remove_lora(adapter_id)
        self._adapter_names.pop(adapter_id, None)

    async def list_lora_ids(self) -> set[int]:
        async with _engine_errors("list_loras"):
            return set(await self._llm.list_loras())

    # -- weight transfer --------------------------------------------------------------
    async def init_weight_transfer(self, init_info: TransferInfo) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        async with _engine_errors("init_weight_transfer_engine"):
            await self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    async def start_weight_update(self) -> None:
        async with _engine_errors("start_weight_update"):
            await self._llm.start_weight_update()

    async def update_weights(self, update_info: TransferInfo | list[TransferInfo]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        async with _engine_errors("update_weights"):
            await self._llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))

    async def finish_weight_update(self) -> None:
        async with _engine_errors("finish_weight_update"):
            await self._llm.finish_weight_update(None)

    async def shutdown_weight_transfer(self) -> None:
        async with _engine_errors("shutdown_weight_transfer_engine"):
            await self._llm.shutdown_weight_transfer_engine()

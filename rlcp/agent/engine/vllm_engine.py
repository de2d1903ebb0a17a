"""`VllmEngine`: the Engine seam over a vLLM AsyncLLM running in the agent's process.

The only place (with `vllm_inference` and the modules it is split into: `vllm_args`,
`vllm_weight_ops`, `vllm_checksums`, `vllm_errors`) that imports vllm. Every vLLM failure is
translated to `EngineError` (`vllm_errors.engine_errors`), so the agent's operations see one
error type.

Notes from vLLM 0.32's behaviour that shape this adapter (the weights' are in `vllm_weight_ops`):
- Keep-mode pauses leave requests inside the engine: they are counted as frozen.
- `AsyncLLM.sleep(level, mode)` pauses the scheduler (`mode`) before releasing memory, and
  `wake_up` resumes it once fully awake; vLLM's `is_sleeping` is also true while merely
  paused, so whether the memory is asleep is tracked here from our own calls. The CPU build
  accepts sleep and wake_up and ignores them ("sleep mode is not supported on CPU, ignore
  it"): the scheduler is paused and resumed, the weights never leave memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import structlog

from rlcp.agent.engine.base import EngineKind
from rlcp.agent.engine.vllm_args import build_vllm_args, stat_logger_factory
from rlcp.agent.engine.vllm_checksums import VllmChecksums
from rlcp.agent.engine.vllm_errors import engine_errors
from rlcp.agent.engine.vllm_weight_ops import VllmWeightPrimitives
from rlcp.agent.settings import EngineSettings, InferenceSettings
from rlcp.core.wire.agent import PauseMode, RequestCounts
from rlcp.core.wire.server_info import ConfigFormat

__all__ = ["VllmEngine"]

log = structlog.get_logger("rlcp.agent.engine.vllm")


class VllmEngine(VllmWeightPrimitives):
    """The Engine seam over one AsyncLLM: its lifecycle (with vLLM's OpenAI server on it,
    `vllm_inference`), generation control and sleep mode; the weight primitives are
    `VllmWeightPrimitives`' (`vllm_weight_ops`), the checksums `VllmChecksums`', the serve
    arguments and stat logger `vllm_args`'."""

    kind: Final[EngineKind] = "vllm"

    def __init__(self, engine: EngineSettings, inference: InferenceSettings) -> None:
        self._settings = engine
        self._inference_settings = inference
        self._llm: Any = None
        self._inference: Any = None
        self.served_version: str | None = None
        self._queue_depth: dict[str, int] = {"running": 0, "waiting": 0}
        self._pause_mode: PauseMode | None = None
        self._pausing = False  # between a pause (or sleep) call and the resume (or full wake)
        self._checksums = VllmChecksums()
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
        if self._settings.engine_core_start == "fork":
            # vLLM's CPU platform has just asked for spawn (its check_and_update_config sets the
            # variable); AsyncLLM reads it when it starts the EngineCore, next line.
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        self._llm = AsyncLLM.from_vllm_config(
            vllm_config=vllm_config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=[stat_logger_factory(self._queue_depth)],
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
        async with engine_errors("pause"):
            await self._llm.pause_generation(mode=mode)
        self._pause_mode = mode

    async def resume(self) -> None:
        async with engine_errors("resume"):
            await self._llm.resume_generation()
        self._pause_mode = None
        self._pausing = False

    async def is_paused(self) -> bool:
        async with engine_errors("is_paused"):
            return bool(await self._llm.is_paused())

    # -- sleep mode ---------------------------------------------------------------
    async def sleep(self, level: int, mode: PauseMode) -> None:
        self._pausing = True
        async with engine_errors(f"sleep(level={level})"):
            await self._llm.sleep(level, mode)
        self._asleep = self._asleep or level >= 1  # level 0 only pauses scheduling
        self._pause_mode = mode

    async def wake_up(self, tags: list[str] | None) -> bool:
        async with engine_errors("wake_up"):
            fully_awake = bool(await self._llm.wake_up(tags))
        if fully_awake:
            self._asleep = False
            self._pause_mode = None  # vLLM resumed scheduling
            self._pausing = False
        return fully_awake

    async def is_sleeping(self) -> bool:
        return self._asleep

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        async with engine_errors("abort"):
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

    # -- configuration -------------------------------------------------------------
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

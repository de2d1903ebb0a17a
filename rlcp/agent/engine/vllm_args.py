"""How `VllmEngine` configures vLLM: the serve arguments `vllm serve` would parse, our worker
extension installed in them, and the stat logger that keeps the scheduler's queue depth.

Kept apart from the engine so what vLLM is started with reads in one place (a test builds the
arguments without starting an engine).
"""

from __future__ import annotations

from typing import Any

from rlcp.agent.engine.vllm_worker import AdapterChecksumsExtension
from rlcp.agent.settings import EngineSettings, InferenceSettings

_WORKER_EXTENSION = f"{AdapterChecksumsExtension.__module__}.{AdapterChecksumsExtension.__qualname__}"


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


def stat_logger_factory(sink: dict[str, int]) -> Any:
    """A vLLM stat logger class that keeps the scheduler's last running/waiting counts in `sink`."""
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

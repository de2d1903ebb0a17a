"""The environment a CPU vLLM engine started by the harness runs with: one place for it, taken by
every child (`processes.child_env`) and by the Ray head, whose placed agents inherit it
(`raycluster`). Each default yields to this process's own environment."""

from __future__ import annotations

import os


def engine_env() -> dict[str, str]:
    """What a CPU vLLM engine started here runs with, each unless this process's environment
    already says otherwise: an offline Hub, a small KV cache, no torch.compile, and the engine's
    model runner inside its EngineCore process on one thread. The children and the Ray head
    (whose placed agents inherit it) both take it."""
    defaults = {
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # vLLM's CPU platform compiles a few sampling helpers (logprob ranks, top-k/top-p) with
        # torch.compile's inductor on their first use, in every engine process: 2.5 s of a
        # process's first sampled request with a warm cache, 12 s in a fresh checkout (g++ builds
        # a 145 MB precompiled torch header). For the tiny models children serve, eager is as
        # exact and faster. The model itself already runs eager (`enforce_eager`).
        "TORCH_COMPILE_DISABLE": "1",
        # vLLM's CPU platform runs the model in a worker process of its own (the multiprocessing
        # executor) so it can bind OpenMP threads before torch loads; that process imports vLLM
        # and torch again: ~12 of the ~41 CPU-s an agent spends before its first request. With
        # this off, the model runs in the EngineCore process (the uniprocessing executor, vLLM's
        # default for one GPU), and one OpenMP thread stands in for the one-core binding: two
        # engines never spin against each other's thread teams. AsyncLLM, hence every server
        # here, still runs its EngineCore in a process of its own.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
    }
    return {name: os.environ.get(name, value) for name, value in defaults.items()}

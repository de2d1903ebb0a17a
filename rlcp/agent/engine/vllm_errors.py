"""One error type out of vLLM: every failure of an AsyncLLM call is an `EngineError` naming the
primitive, so the agent's operations see one error type (`vllm_engine`, `vllm_weight_ops`,
`vllm_checksums` wrap each call in `engine_errors`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rlcp.agent.engine.base import EngineError


@asynccontextmanager
async def engine_errors(what: str) -> AsyncIterator[None]:
    """Translate any vLLM failure of the primitive `what` into EngineError."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except EngineError:
        raise
    except Exception as exc:  # vLLM raises many types; the agent needs one
        raise EngineError(f"{what}: {type(exc).__name__}: {exc}") from exc

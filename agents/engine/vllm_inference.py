"""Inference port: vLLM's own OpenAI-compatible app, served on the agent's engine client.

We do not rewrite the OpenAI server: `build_app` + `init_app_state` are the very
functions `vllm serve` uses, pointed at the AsyncLLM this agent owns, so completions,
chat, tokenize/detokenize, models and `return_token_ids` behave exactly as in vLLM.
uvicorn runs in the agent's event loop; the agent, not uvicorn, owns the signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from argparse import Namespace
from collections.abc import Iterator

import uvicorn
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.app import build_app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The agent's runner handles SIGINT/SIGTERM and shuts the whole agent down.
        yield


class InferenceServer:
    def __init__(self, engine_client: EngineClient, args: Namespace) -> None:
        self._engine_client = engine_client
        self._args = args
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.state = None  # the FastAPI app state: openai_serving_models lives here
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        supported_tasks = await self._engine_client.get_supported_tasks()
        app = build_app(self._args, supported_tasks, self._engine_client.model_config)
        await init_app_state(self._engine_client, app.state, self._args, supported_tasks)
        self.state = app.state
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        self._server = _Server(config)
        # vLLM's engine-error handler reads it (as `vllm serve`'s launcher sets it): without
        # it a request that meets a dead engine gets an AttributeError 500, not the engine's error.
        app.state.server = self._server
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="inference-server")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the start-up error
            await asyncio.sleep(0.02)

    async def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            async with asyncio.timeout(timeout_s):
                await self._task
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

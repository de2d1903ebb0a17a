"""Inference port: vLLM's own OpenAI-compatible app, served on the agent's engine client.

We do not rewrite the OpenAI server: `build_app` + `init_app_state` are the very
functions `vllm serve` uses, pointed at the AsyncLLM this agent owns, so completions,
chat, tokenize/detokenize, models and `return_token_ids` behave exactly as in vLLM.
uvicorn runs in the agent's event loop; the agent, not uvicorn, owns the signals.

One addition on the way out: a non-streamed answer carries `X-RL-Weight-Versions`, the
engine's own record of which weights sampled which output tokens (vLLM tracks these spans
per request but its OpenAI answers drop them). A request frozen by a keep-mode pause and
resumed after an update says so there, rather than passing as the version it started on.
And one check on the way in: a request that names the weights it expects
(`X-RL-Expect-Weight-Version`, as the gateway sends) is refused 409 when these are others.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import socket
from argparse import Namespace
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import uvicorn
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.app import build_app

from rlcore.wire.agent import (
    EXPECT_VERSION_HEADER,
    WEIGHT_VERSIONS_HEADER,
    version_mismatch_body,
    weight_versions_header,
)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The agent's runner handles SIGINT/SIGTERM and shuts the whole agent down.
        yield


# The spans of the request being answered: one dict per engine request (a batch of prompts
# makes several, started in prompt order), choice index -> spans. Set by `SpanHeaders` for
# each HTTP request, filled by `SpanRecordingClient.generate`, which vLLM's handlers call in
# the request's context, so both see the same list.
Spans = list[dict[int, list[tuple[str, int, int]]]]
_SPANS: contextvars.ContextVar[Spans | None] = contextvars.ContextVar("rl_weight_version_spans", default=None)
_SPANS_HEADER = WEIGHT_VERSIONS_HEADER.lower().encode()
_EXPECT = EXPECT_VERSION_HEADER.lower().encode()


class SpanRecordingClient:
    """The engine client vLLM's OpenAI handlers use, recording each finished choice's
    weight-version spans for the answer's headers; everything else is the engine's own."""

    def __init__(self, inner: EngineClient) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        request_spans = _SPANS.get()
        mine: dict[int, list[tuple[str, int, int]]] = {}
        if request_spans is not None:
            request_spans.append(mine)
        # aclosing: when vLLM closes this generator (the client went away), the engine's own
        # is closed at once, which aborts the request there.
        async with contextlib.aclosing(self._inner.generate(*args, **kwargs)) as outputs:
            async for out in outputs:
                if out.finished:
                    for choice in out.outputs:
                        if choice.weight_versions:
                            mine[choice.index] = [(s.version, s.start, s.end) for s in choice.weight_versions]
                yield out


class VersionedAnswers:
    """ASGI middleware: refuses a request expecting other weights than these; adds the
    recorded spans, one list per choice, to a response whose headers go out after generation
    finished (a stream's go out before: it has none)."""

    def __init__(self, app: Any, served_version: Callable[[], str | None]) -> None:
        self.app = app
        self.served_version = served_version

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        expected = next((v.decode() for k, v in scope["headers"] if k == _EXPECT), None)
        if expected is not None and expected != (served := self.served_version()):
            body = json.dumps(version_mismatch_body(expected, served)).encode()
            await send({"type": "http.response.start", "status": 409,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        spans: Spans = []
        token = _SPANS.set(spans)

        async def send_with_spans(message: dict[str, Any]) -> None:
            choices = [per[i] for per in spans for i in sorted(per)]
            if message["type"] == "http.response.start" and choices:
                value = weight_versions_header(choices).encode()
                message = {**message, "headers": [*message.get("headers", []), (_SPANS_HEADER, value)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_spans)
        finally:
            _SPANS.reset(token)


class InferenceServer:
    def __init__(self, engine_client: EngineClient, args: Namespace, *,
                 served_version: Callable[[], str | None]) -> None:
        self._engine_client = engine_client
        self._served_version = served_version
        self._args = args
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.state = None  # the FastAPI app state: openai_serving_models lives here
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        supported_tasks = await self._engine_client.get_supported_tasks()
        app = build_app(self._args, supported_tasks, self._engine_client.model_config)
        await init_app_state(SpanRecordingClient(self._engine_client), app.state, self._args, supported_tasks)
        self.state = app.state
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(VersionedAnswers(app, self._served_version), log_level="warning", access_log=False, lifespan="on")
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

"""Inference port: vLLM's own OpenAI-compatible app, served on the agent's engine client.

We do not rewrite the OpenAI server: `build_app` + `init_app_state` are the very
functions `vllm serve` uses, pointed at the AsyncLLM this agent owns, so completions,
chat, tokenize/detokenize, models and `return_token_ids` behave exactly as in vLLM.
uvicorn runs in the agent's event loop; the agent, not uvicorn, owns the signals.

Additions on the way out: a non-streamed answer carries `X-RL-Weight-Versions`, the
engine's own record of which weights sampled which output tokens (vLLM tracks these spans
per request but its OpenAI answers drop them); a stream carries them on the chunk that
finishes each choice; and tokens-in/tokens-out logprob entries are named `"token_id:<id>"`
for the clients that read them so (`answer_fields.py`). A request frozen by a keep-mode
pause and resumed after an update says so there, rather than passing as the version it
started on. And one check on the way in: a request that names the weights it expects
(`X-RL-Expect-Weight-Version`, as the gateway sends) is refused 409 when these are others, or
while the engine is paused; and again at each of its engine calls' first output: one that
waited in the engine's queue (admitted before a pause, not yet scheduled) while the weights
changed is refused 409 rather than answered by the new weights under the label it was admitted
with (a stream's headers wait for its first chunk, so that refusal is still a 409).

vLLM's tokens-in/tokens-out route (`POST /inference/v1/generate`) is served too: the agent
starts vLLM's app with its scale-out routes on (`build_vllm_args`), as `vllm serve
--enable-scale-out` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import socket
from argparse import Namespace
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.app import build_app

from rlcp.agent.engine.answer_fields import Span, amend_events, amend_json
from rlcp.core.wire.agent.inference import (
    ENGINE_DIED_HEADER,
    EXPECT_VERSION_HEADER,
    WEIGHT_VERSIONS_HEADER,
    engine_dead_body,
    paused_refusal_body,
    version_mismatch_body,
    weight_versions_header,
    weights_changed_body,
)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The agent's runner handles SIGINT/SIGTERM and shuts the whole agent down.
        yield


@dataclass
class CallSpans:
    """One engine request of an HTTP request (a batch of prompts makes several, started in
    prompt order): how many choices it makes, and each finished choice's spans."""

    n: int
    by_index: dict[int, list[Span]] = field(default_factory=dict)


class WeightsChanged(Exception):
    """Raised into vLLM's handler at an engine call's first output when the weights changed
    since the request was admitted for others: closing the engine's generator aborts the
    request there, and `VersionedAnswers` answers 409 in place of what the handler sends."""


@dataclass
class Answering:
    """One HTTP request being answered: each engine call's spans, and the weights it was
    admitted for (`X-RL-Expect-Weight-Version`; None: it named none)."""

    expected: str | None
    served_version: Callable[[], str | None]
    calls: list[CallSpans] = field(default_factory=list)
    refusal: dict[str, dict[str, str]] | None = None  # set when an engine call was refused

    def check_first_output(self) -> None:
        """At an engine call's first output (its first token is computed): the weights must
        still be those it was admitted for. The served version changes only while the engine
        is paused (`rlcp/agent/weight_state.py`), so a first token computed before the pause
        reached its handler long before; one that differs was computed by the new weights."""
        if self.expected is None or (served := self.served_version()) == self.expected:
            return
        self.refusal = weights_changed_body(self.expected, served)
        raise WeightsChanged(self.refusal["error"]["message"])


# The request being answered. Set by `VersionedAnswers` for each HTTP request, filled and
# checked by `SpanRecordingClient.generate`, which vLLM's handlers call in the request's
# context, so both see the same record.
_ANSWERING: contextvars.ContextVar[Answering | None] = contextvars.ContextVar("rl_answering", default=None)
_SPANS_HEADER = WEIGHT_VERSIONS_HEADER.lower().encode()
_DIED_HEADER = ENGINE_DIED_HEADER.lower().encode()
_EXPECT = EXPECT_VERSION_HEADER.lower().encode()
_TOKENS_ROUTE = "/inference/v1/generate"  # vLLM's tokens-in/tokens-out: its logprob entries get names


class SpanRecordingClient:
    """The engine client vLLM's OpenAI handlers use, recording each finished choice's
    weight-version spans for the answer; everything else is the engine's own."""

    def __init__(self, inner: EngineClient) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        answering = _ANSWERING.get()
        params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
        mine = CallSpans(n=getattr(params, "n", None) or 1)
        if answering is not None:
            answering.calls.append(mine)
        first = True
        # aclosing: when vLLM closes this generator (the client went away), or the first
        # output finds other weights, the engine's own is closed at once, which aborts the
        # request there.
        async with contextlib.aclosing(self._inner.generate(*args, **kwargs)) as outputs:
            async for out in outputs:
                if first and answering is not None:
                    answering.check_first_output()
                first = False
                if out.finished:
                    for choice in out.outputs:
                        if choice.weight_versions:
                            mine.by_index[choice.index] = [(s.version, s.start, s.end) for s in choice.weight_versions]
                yield out


def _spans_of(calls: list[CallSpans]) -> Callable[[int], list[Span] | None]:
    """An answer's choice index -> its spans: vLLM numbers the choices of a batch's k-th
    prompt from k * n."""

    def spans_of(index: int) -> list[Span] | None:
        for call in calls:
            if index < call.n:
                return call.by_index.get(index)
            index -= call.n
        return None

    return spans_of


class VersionedAnswers:
    """ASGI middleware: refuses a request expecting other weights than these, or arriving
    after the engine died (503 `engine_dead`: it never reached an engine, another worker may
    take it); marks the 5xx of a request during which the engine died (`X-RL-Engine-Died`);
    adds the recorded spans to the answer (`_AmendedAnswer`)."""

    def __init__(
        self, app: Any, served_version: Callable[[], str | None], alive: Callable[[], bool], pausing: Callable[[], bool]
    ) -> None:
        self.app = app
        self.served_version = served_version
        self.alive = alive
        self.pausing = pausing

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.alive():
            await _answer_json(send, 503, engine_dead_body())
            return
        expected = next((v.decode() for k, v in scope["headers"] if k == _EXPECT), None)
        if expected is not None and expected != (served := self.served_version()):
            await _answer_json(send, 409, version_mismatch_body(expected, served))
            return
        if expected is not None and self.pausing():
            # It would queue behind the pause and may run after an update, on other weights.
            await _answer_json(send, 409, paused_refusal_body(expected))
            return
        answering = Answering(expected, self.served_version)
        token = _ANSWERING.set(answering)
        answer = _AmendedAnswer(send, answering, tokens_route=scope["path"] == _TOKENS_ROUTE, alive=self.alive)
        try:
            await self.app(scope, receive, answer.send)
        finally:
            _ANSWERING.reset(token)


async def _answer_json(send: Any, status: int, payload: object) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _AmendedAnswer:
    """The sending side of one answer, with the agent's additions:
    - the spans, one list per choice, in `X-RL-Weight-Versions` when the headers go out after
      generation finished (a non-streamed answer);
    - in a stream, `weight_versions` on the chunk that finishes each choice (vLLM's
      tokens-in/tokens-out stream sets it there itself);
    - on the tokens-in/tokens-out route, logprob entries named `"token_id:<id>"`: a JSON
      answer is held whole (it is sent in one piece anyway) and its length set again;
    - on a 5xx sent once the engine is dead, `X-RL-Engine-Died`;
    - for a request refused at its first output (`Answering.check_first_output`), a 409 in
      place of whatever the handler makes of it; a stream admitted for named weights holds its
      headers until its first chunk, so that it can still be refused so (vLLM 0.32 sends the
      first chunk of a completion or chat stream, the role chunk too, with the first output; a
      stream whose first chunk came earlier would end with vLLM's error event instead, no token
      of other weights in it)."""

    def __init__(self, send: Any, answering: Answering, *, tokens_route: bool, alive: Callable[[], bool]) -> None:
        self._send, self._answering, self._tokens_route, self._alive = send, answering, tokens_route, alive
        self._calls = answering.calls
        self._held_start: dict[str, Any] | None = None
        self._held_body: list[bytes] = []
        self._stream = False
        self._stream_start: dict[str, Any] | None = None  # a stream's headers, until its first chunk
        self._refused = False  # the 409 went out: the handler's own answer is dropped

    async def send(self, message: dict[str, Any]) -> None:
        if self._refused:
            return
        if message["type"] == "http.response.start":
            await self._start(message)
        elif message["type"] == "http.response.body" and self._stream_start is not None:
            start, self._stream_start = self._stream_start, None
            if self._answering.refusal is not None:
                await self._refuse()
                return
            await self._send(start)
            await self.send(message)
        elif message["type"] == "http.response.body" and self._held_start is not None:
            self._held_body.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._send_held()
        elif message["type"] == "http.response.body" and self._stream and message.get("body"):
            spans_of = None if self._tokens_route else _spans_of(self._calls)
            body = amend_events(message["body"], name_tokens=self._tokens_route, spans_of=spans_of)
            await self._send({**message, "body": body})
        else:
            await self._send(message)

    async def _refuse(self) -> None:
        assert self._answering.refusal is not None
        self._refused = True
        await _answer_json(self._send, 409, self._answering.refusal)

    async def _start(self, message: dict[str, Any]) -> None:
        if self._answering.refusal is not None:
            await self._refuse()
            return
        headers = list(message.get("headers", []))
        choices = [call.by_index[i] for call in self._calls for i in sorted(call.by_index)]
        if choices:
            headers.append((_SPANS_HEADER, weight_versions_header(choices).encode()))
        if message["status"] >= 500 and not self._alive():
            headers.append((_DIED_HEADER, b"1"))
        message = {**message, "headers": headers}
        content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        self._stream = content_type.startswith(b"text/event-stream")
        if self._stream and self._answering.expected is not None:
            self._stream_start = message
            return
        if self._tokens_route and content_type.startswith(b"application/json"):
            self._held_start = message
            return
        await self._send(message)

    async def _send_held(self) -> None:
        assert self._held_start is not None
        start, body = self._held_start, b"".join(self._held_body)
        self._held_start, self._held_body = None, []
        amended = amend_json(body)
        if amended is not None:
            body = amended
            start = {
                **start,
                "headers": [
                    *((k, v) for k, v in start["headers"] if k.lower() != b"content-length"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        await self._send(start)
        await self._send({"type": "http.response.body", "body": body})


class InferenceServer:
    def __init__(
        self,
        engine_client: EngineClient,
        args: Namespace,
        *,
        served_version: Callable[[], str | None],
        alive: Callable[[], bool],
        pausing: Callable[[], bool],
    ) -> None:
        self._engine_client = engine_client
        self._served_version = served_version
        self._alive = alive
        self._pausing = pausing
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
        config = uvicorn.Config(
            VersionedAnswers(app, self._served_version, self._alive, self._pausing),
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
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

"""Inference port for a `SimEngine`: the slice of vLLM's OpenAI API that fleet tests use.

The real agent serves vLLM's own OpenAI app; a simulated engine has no tokenizer and
no vLLM, so this tiny aiohttp app stands in for it: `GET /v1/models` and
`POST /v1/completions` (streaming or not), with `token_ids` in each choice as vLLM's
`return_token_ids` gives them. Text is a byte encoding in and " t<id>" per token out.
A non-streamed answer carries `X-RL-Weight-Versions`, and a request expecting other weights
(`X-RL-Expect-Weight-Version`) is refused 409, as the real agent's are: on arrival, while
paused, and at its first output when the weights changed while it waited in the queue.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from rlcp.agent.engine.base import EngineError
from rlcp.agent.engine.sim import SimEngine, SimOutput
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

ENGINE_KEY = web.AppKey("sim_engine", SimEngine)


class _CompletionRequest(BaseModel):
    # OpenAI clients send many options we do not simulate (temperature, ...): ignore them.
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    prompt: Annotated[StrictStr, Field(min_length=1)] | Annotated[list[StrictInt], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] = 16
    stream: StrictBool = False


class _HttpError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


@web.middleware
async def _error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    if not engine.is_alive():  # as the vLLM agent answers (`VersionedAnswers`)
        return web.json_response(engine_dead_body(), status=503)
    try:
        return await handler(request)
    except _HttpError as exc:
        detail: dict[str, object] = {"code": exc.code, "message": exc.message}
        if exc.field is not None:
            detail["field"] = exc.field
        return web.json_response({"error": detail}, status=exc.status)
    except EngineError as exc:
        if not engine.is_alive():  # it died during this request
            return web.json_response(
                {"error": {"code": "engine_error", "message": str(exc)}}, status=500, headers={ENGINE_DIED_HEADER: "1"}
            )
        return web.json_response({"error": {"code": "engine_error", "message": str(exc)}}, status=503)


def _sse(data: dict[str, object]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def _text(token_ids: list[int]) -> str:
    return "".join(f" t{t}" for t in token_ids)


async def _list_models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    base = engine.model_name
    cards = [{"id": base, "object": "model", "owned_by": "sim", "root": base, "parent": None}]
    cards += [
        {"id": name, "object": "model", "owned_by": "sim", "root": name, "parent": base}
        for name in engine.served_lora_names()
    ]
    return web.json_response({"object": "list", "data": cards})


async def _parse(request: web.Request) -> _CompletionRequest:
    try:
        raw = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _HttpError(400, "bad_request", f"the body is not JSON: {exc}", "body") from exc
    try:
        return _CompletionRequest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"][:1]) or "body"
        raise _HttpError(400, "bad_request", f"{field}: {first['msg']}", field) from exc


async def _create_completion(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    expected = request.headers.get(EXPECT_VERSION_HEADER)
    if expected is not None and expected != engine.served_version:
        return web.json_response(version_mismatch_body(expected, engine.served_version), status=409)
    if expected is not None and engine.pausing:  # as the vLLM agent refuses (`VersionedAnswers`)
        return web.json_response(paused_refusal_body(expected), status=409)
    body = await _parse(request)
    if body.model != engine.model_name and body.model not in engine.served_lora_names():
        raise _HttpError(404, "model_not_found", f"the model {body.model!r} does not exist", "model")
    prompt = list(body.prompt.encode()) if isinstance(body.prompt, str) else body.prompt
    request_id = f"cmpl-{uuid.uuid4().hex}"
    lora = None if body.model == engine.model_name else body.model
    head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": body.model}
    outputs = engine.generate(prompt, max_tokens=body.max_tokens, request_id=request_id, lora_name=lora)
    # aclosing: a client that hangs up, or a refusal at the first output, closes the
    # generator, which aborts the engine request.
    async with aclosing(outputs):
        # The first output is awaited before anything goes out, so an engine that refuses the
        # request still gets a JSON error status, and a request that waited in the queue while
        # the weights changed is refused as the vLLM agent refuses it (`Answering`).
        out = await anext(outputs)
        if expected is not None and expected != engine.served_version:
            return web.json_response(weights_changed_body(expected, engine.served_version), status=409)
        if not body.stream:
            return await _whole_answer(head, prompt, out, outputs)
        return await _stream(request, head, out, outputs)


async def _whole_answer(
    head: dict[str, Any], prompt: list[int], out: SimOutput, outputs: AsyncIterator[SimOutput]
) -> web.Response:
    """A non-streaming completion: the last (cumulative) output, its usage and weight versions."""
    last = out
    async for last in outputs:
        pass
    choice = {
        "index": 0,
        "text": _text(last.token_ids),
        "finish_reason": last.finish_reason,
        "logprobs": None,
        "token_ids": last.token_ids,
        "prompt_token_ids": prompt,
    }
    usage = {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(last.token_ids),
        "total_tokens": len(prompt) + len(last.token_ids),
    }
    headers = {WEIGHT_VERSIONS_HEADER: weight_versions_header([last.weight_versions])} if last.weight_versions else None
    return web.json_response({**head, "choices": [choice], "usage": usage}, headers=headers)


async def _stream(
    request: web.Request, head: dict[str, Any], out: SimOutput, outputs: AsyncIterator[SimOutput]
) -> web.StreamResponse:
    """A streaming completion as server-sent events; failures after the first output become an error event."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    sent = 0
    try:
        while True:
            delta = out.token_ids[sent:]  # outputs are cumulative; stream only what is new
            sent = len(out.token_ids)
            choice = {
                "index": 0,
                "text": _text(delta),
                "finish_reason": out.finish_reason,
                "logprobs": None,
                "token_ids": delta,
            }
            await response.write(_sse({**head, "choices": [choice]}))
            if out.finished:
                break
            out = await anext(outputs)
    except EngineError as exc:
        await response.write(_sse({"error": {"code": "engine_error", "message": str(exc)}}))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def build_sim_inference_app(engine: SimEngine) -> web.Application:
    app = web.Application(middlewares=[_error_middleware])
    app[ENGINE_KEY] = engine
    app.router.add_get("/v1/models", _list_models)
    app.router.add_post("/v1/completions", _create_completion)
    return app

"""What the agent's tests on a real vLLM engine share: reads and completions against it, and a
stream held open to be paused mid-way. The `agent` fixture: conftest.py."""

from __future__ import annotations

from rlcp.harness.hold import Hold
from rlcp.harness.http import CompletionStream, call

PROMPT = "The quick brown fox jumps over the lazy dog."


async def state(http, agent) -> dict:
    status, body = await call(http, "GET", agent.admin_url + "/v1/agent/state")
    assert status == 200
    return body


async def complete(http, agent, prompt, max_tokens=16, model="tiny", **extra) -> dict:
    status, body = await call(
        http,
        "POST",
        agent.inference_url + "/v1/completions",
        body={
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            **extra,
        },
    )
    assert status == 200, body
    return body["choices"][0]


async def tokenize(http, agent, text) -> list[int]:
    status, body = await call(http, "POST", agent.inference_url + "/tokenize", body={"model": "tiny", "prompt": text})
    assert status == 200, body
    return body["tokens"]


def held_stream(http, agent, prompt, max_tokens: int, hold: Hold) -> CompletionStream:
    """A streamed completion read in the background, held by `hold` (rlcp/harness/hold.py), so it
    is still running when the test acts on it."""
    return CompletionStream(http, agent.inference_url, prompt, max_tokens=max_tokens, xargs=hold.xargs, name="held")

"""What the agent's tests on a real vLLM engine share: reads and completions against it, and a
stream held open to be paused mid-way. The `agent` fixture: conftest.py."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from rlcp.harness.hold import Hold
from rlcp.harness.http import call

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


class Stream:
    """A streaming completion read in the background, token by token; `hold`: held by it
    (rlcp/harness/hold.py), so it is still running when the test acts on it."""

    def __init__(self, http, agent, prompt, max_tokens, hold: Hold | None = None):
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.xargs = hold.xargs if hold else None
        self.task = asyncio.create_task(self._run(http, agent, prompt, max_tokens), name="test-stream")

    async def _run(self, http, agent, prompt, max_tokens):
        try:
            await self._stream(http, agent, prompt, max_tokens)
        except aiohttp.ServerDisconnectedError:
            # A pooled keep-alive connection the server closed at that moment: a client
            # artefact. Before any token arrived, the request never reached the engine: retry.
            if self.tokens:
                raise
            await self._stream(http, agent, prompt, max_tokens)

    async def _stream(self, http, agent, prompt, max_tokens):
        payload = {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        if self.xargs:
            payload["vllm_xargs"] = self.xargs
        async with http.post(
            agent.inference_url + "/v1/completions", json=payload, timeout=aiohttp.ClientTimeout(total=120)
        ) as resp:
            assert resp.status == 200
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                self.tokens.extend(choice.get("token_ids") or [])
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]

    async def settled(self, quiet_s: float = 0.5, timeout_s: float = 30) -> int:
        """The token count once no chunk arrived for `quiet_s`."""
        async with asyncio.timeout(timeout_s):
            while True:
                count = len(self.tokens)
                await asyncio.sleep(quiet_s)
                if len(self.tokens) == count:
                    return count

    async def wait_for_tokens(self, n: int, timeout_s: float = 30) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.tokens) < n:
                assert not self.task.done(), "stream ended early"
                await asyncio.sleep(0.005)

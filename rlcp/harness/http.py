"""HTTP helpers for talking to agents and controllers on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence
from typing import Any

import aiohttp


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout_s: float = 120.0,
) -> tuple[int, Any]:
    """One HTTP call with a deadline; returns (status, parsed JSON body or text)."""
    async with session.request(
        method, url, json=body, data=data, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as resp:
        text = await resp.text(errors="replace")
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


def free_port() -> int:
    """A port free on 127.0.0.1 right now (for a process that must come back on the same address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# What a call to a process that is restarting (or frozen past the call's deadline) may raise.
CONNECTION_ERRORS = (aiohttp.ClientError, TimeoutError)


class CompletionStream:
    """One streaming completion (`/v1/completions`, `stream` with `return_token_ids`), read in
    the background; records what came back (tokens, finish reason, error) instead of raising."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        prompt: str | list[int],
        *,
        max_tokens: int,
        timeout_s: float = 120.0,
        name: str = "stream",
        stream_interval: int | None = None,
        xargs: dict[str, str] | None = None,
    ) -> None:
        self.max_tokens = max_tokens
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.error: str | None = None
        payload: dict[str, Any] = {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        if stream_interval is not None:
            # vLLM's per-request chunking: the first token at once, then one chunk per N tokens.
            payload["stream_interval"] = stream_interval
        if xargs:
            # vLLM's extra sampling arguments (`vllm_xargs`): a hold (rlcp/harness/hold.py), say.
            payload["vllm_xargs"] = xargs
        self.task = asyncio.create_task(self._run(http, base_url + "/v1/completions", payload, timeout_s), name=name)

    async def _run(self, http: aiohttp.ClientSession, url: str, payload: dict[str, Any], timeout_s: float) -> None:
        try:
            try:
                await self._read(http, url, payload, timeout_s)
            except aiohttp.ServerDisconnectedError:
                # A pooled keep-alive connection the server closed at that moment: a client
                # artefact. Before any token came back, the request never reached the engine.
                if self.tokens:
                    raise
                await self._read(http, url, payload, timeout_s)
        except Exception as exc:  # recorded: the tests assert that none errors
            self.error = f"{type(exc).__name__}: {exc}"

    async def _read(self, http: aiohttp.ClientSession, url: str, payload: dict[str, Any], timeout_s: float) -> None:
        async with http.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                self.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    self.error = f"error chunk: {chunk['error']}"
                    return
                choice = chunk["choices"][0]
                self.tokens.extend(choice.get("token_ids") or [])
                self.finish_reason = choice.get("finish_reason") or self.finish_reason

    async def wait_for_tokens(self, n: int, timeout_s: float = 60.0) -> None:
        """Until `n` tokens came back; an error or an end before that fails at once."""
        async with asyncio.timeout(timeout_s):
            while len(self.tokens) < n:
                assert not self.task.done(), f"the stream ended after {len(self.tokens)} tokens: {self.error}"
                await asyncio.sleep(0.005)

    @property
    def full(self) -> bool:
        """Finished in full: every token asked for, no error."""
        return self.error is None and self.finish_reason == "length" and len(self.tokens) == self.max_tokens


async def settled(streams: Sequence[CompletionStream], quiet_s: float = 0.5, timeout_s: float = 30.0) -> list[int]:
    """Each stream's token count once none of them received a chunk for `quiet_s`: after a pause
    has landed, the chunks the engine sent before it may still be on their way to this process."""
    async with asyncio.timeout(timeout_s):
        while True:
            counts = [len(st.tokens) for st in streams]
            await asyncio.sleep(quiet_s)
            if [len(st.tokens) for st in streams] == counts:
                return counts

"""Rollouts through one inference endpoint: tokens in, token ids and the engine's logprobs out.

Every request goes to vLLM's tokens-in/tokens-out route (`POST /inference/v1/generate`), the
one RL trainers sample through (verifiers' `TrainClient`, prime-rl): prompt token ids in; the
sampled token ids, the engine's logprob of each, and the weight versions that produced them
out. Versions come from the answer's spans (`weight_versions` per choice, over output-token
indexes), then from the gateway's `X-RL-Weight-Versions` / `X-RL-Weight-Version` headers; a
token no answer names a version for is `None`.

The fleet's URL is the gateway; a hand-rolled fleet (bench/rl_run.py's baseline) passes its
servers' URLs and is sampled round-robin, as a trainer without a gateway does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

ROUTE = "/inference/v1/generate"


class SamplingError(Exception):
    """No server answered a rollout request within its attempts; the message says why."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion: what the trainer needs to score and weight it."""

    prompt: tuple[int, ...]
    tokens: list[int]
    logprobs: list[float]  # the engine's: the behaviour policy of each token
    versions: list[str | None]  # the weight version that sampled each token
    worker: str | None  # the member that answered (the gateway's X-RL-Worker), or the server's URL


def token_versions(spans: Sequence[dict[str, Any]] | None, length: int, fallback: str | None) -> list[str | None]:
    """The version of each of `length` output tokens from `{version, start, end}` spans;
    tokens no span covers get `fallback`."""
    out: list[str | None] = [fallback] * length
    for span in spans or ():
        for i in range(max(0, int(span["start"])), min(length, int(span["end"]))):
            out[i] = str(span["version"])
    return out


def parse_answer(body: dict[str, Any], headers: Any, prompt: tuple[int, ...], default_worker: str) -> list[Completion]:
    """The completions of one `/inference/v1/generate` answer (one per choice, by index)."""
    header_spans: list[Any] = []
    if raw := headers.get("X-RL-Weight-Versions"):
        try:
            header_spans = json.loads(raw)
        except ValueError:
            header_spans = []
    fallback = headers.get("X-RL-Weight-Version") or None
    worker = headers.get("X-RL-Worker") or default_worker
    out = []
    for choice in sorted(body["choices"], key=lambda c: c.get("index", 0)):
        tokens = [int(t) for t in choice["token_ids"]]
        entries = (choice.get("logprobs") or {}).get("content") or []
        if len(entries) != len(tokens):
            raise SamplingError(f"{worker} answered {len(tokens)} tokens with {len(entries)} logprobs")
        index = choice.get("index", 0)
        spans = choice.get("weight_versions")
        if spans is None and index < len(header_spans):
            spans = header_spans[index]
        out.append(
            Completion(
                prompt,
                tokens,
                [float(e["logprob"]) for e in entries],
                token_versions(spans, len(tokens), fallback),
                worker,
            )
        )
    return out


@dataclass
class Sampler:
    """Samples `group` completions per prompt from `urls` (the gateway, or servers round-robin)."""

    session: aiohttp.ClientSession
    urls: Sequence[str]
    model: str
    max_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    temperature: float = 1.0
    timeout_s: float = 120.0  # one request's deadline
    attempts: int = 4  # a request refused (503 while nothing can serve, a dead server) is sent again
    failed: int = 0  # requests that failed and were sent again
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    async def sample(self, prompts: Sequence[tuple[int, ...]], group: int, seed: int) -> list[Completion]:
        """`group` completions of each prompt, in prompt order; seeds fixed by `seed`."""
        answers = await asyncio.gather(*(self._one(p, group, seed * 1000 + i * group) for i, p in enumerate(prompts)))
        return [c for answer in answers for c in answer]

    async def _one(self, prompt: tuple[int, ...], group: int, seed: int) -> list[Completion]:
        body = {
            "model": self.model,
            "token_ids": list(prompt),
            "sampling_params": {
                "n": group,
                "max_tokens": self.max_tokens,
                "min_tokens": self.max_tokens,
                "ignore_eos": True,
                "temperature": self.temperature,
                "top_p": 1.0,
                "top_k": -1,
                "logprobs": 0,
                "seed": seed,
                "skip_special_tokens": False,
            },
        }
        reason = "no attempt"
        for attempt in range(self.attempts):
            url = self.urls[next(self._turn) % len(self.urls)]
            try:
                async with self.session.post(
                    url + ROUTE, json=body, headers=self.headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
                ) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        return parse_answer(json.loads(text), resp.headers, prompt, url)
                    reason = f"{url}: HTTP {resp.status}: {text[:300]}"
                    if resp.status < 500 and resp.status not in (408, 409, 429):
                        break  # the request itself is wrong: sending it again changes nothing
            except (aiohttp.ClientError, TimeoutError) as exc:
                reason = f"{url}: {type(exc).__name__}: {exc}"
            self.failed += 1
            await asyncio.sleep(0.2 * (attempt + 1))
        raise SamplingError(f"a rollout failed after {self.attempts} attempts; last: {reason}")

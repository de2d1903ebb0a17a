"""What the tests of the `sglang` flavor against SGLang's own server share (the fixtures are
conftest.py's): the prompts, the controller settings for a real engine, SGLang's native calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from rlcp.controlplane.settings import ControllerSettings
from rlcp.harness.controller import controller_settings
from rlcp.harness.http import call
from rlcp.harness.sglang import SglangServerProcess
from rlcp.harness.waiting import wait_for

PROMPT = "Weights move from the trainer to every engine in the fleet."
# Longer than SGLang's radix-cache pages: a cached prefix from the old weights would be reused.
LONG_PROMPT = (
    "The trainer writes weights and every engine in the fleet must load them before serving "
    "again, so the controller pauses each one, reloads, verifies and resumes. "
) * 3
STREAM_TOKENS = 400
N_STREAMS = 4  # the server runs at most 8 requests at once (--max-running-requests)


def engine_controller_settings(
    tmp_path: Path, specs: list[dict[str, Any]], tiny_models: dict[str, Path], *, token: str, **overrides: Any
) -> ControllerSettings:
    """The controller of every test here: the harness's deadlines (a few seconds, made for
    simulated engines) stretched for real CPU engines on a loaded machine (a disk load can take
    minutes there), a calmer reconciler, and checkpoints read from the tiny models' directory."""
    return controller_settings(
        tmp_path,
        specs,
        allowed_roots=[str(tiny_models["base"].parent)],
        workers={
            "token": token,
            "timeout_s": 30,
            "attempts": 2,
            "retry_budget_s": 40,
            "pause_timeout_s": 120,
            "weight_load_timeout_s": 300,
        },
        reconcile={"poll_interval_s": 0.2, "interval_s": 0.2, "backoff_initial_s": 0.5, "backoff_max_s": 4},
        **overrides,
    )


async def generate(
    http, server: SglangServerProcess, prompt: str = PROMPT, max_new_tokens: int = 16, url: str | None = None
) -> tuple[list[int], dict]:
    """SGLang's native `/generate`, greedy: (output ids, meta_info)."""
    status, body = await call(
        http,
        "POST",
        (url or server.url) + "/generate",
        timeout_s=120,
        body={
            "text": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        },
    )
    assert status == 200, body
    return body["output_ids"], body["meta_info"]


async def post(http, server: SglangServerProcess, path: str, body: dict | None = None) -> dict:
    status, answer = await call(http, "POST", server.url + path, body=body or {}, timeout_s=300)
    assert status == 200, (path, answer)
    return answer


async def load_direct(http, server: SglangServerProcess, path: Path, version: str) -> None:
    """SGLang's own disk update, controller aside."""
    await post(http, server, "/update_weights_from_disk", {"model_path": str(path), "weight_version": version})


def by_worker(result: dict) -> dict[str, tuple[str, str]]:
    return {r["worker_id"]: (r["status"], r["phase"]) for r in result["results"]}


class Stream:
    """One streamed `/generate`, read in the background: tokens so far, finish reason."""

    def __init__(self, http: aiohttp.ClientSession, url: str, prompt: str, max_new_tokens: int) -> None:
        self.tokens = 0
        self.finish: str | None = None
        self.status: int | None = None
        self.versions: list = []
        self.task = asyncio.create_task(self._read(http, url, prompt, max_new_tokens))

    async def _read(self, http, url, prompt, max_new_tokens) -> None:
        body = {
            "text": prompt,
            "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        }
        async with http.post(url + "/generate", json=body, timeout=aiohttp.ClientTimeout(total=300)) as resp:
            self.status = resp.status
            async for line in resp.content:
                text = line.decode().strip()
                if not text.startswith("data:") or text == "data: [DONE]":
                    continue
                meta = json.loads(text[5:])["meta_info"]
                self.tokens = meta["completion_tokens"]
                if meta.get("finish_reason"):
                    self.finish = meta["finish_reason"]["type"]
                    self.versions = meta.get("weight_versions") or []

    @property
    def full(self) -> bool:
        return self.status == 200 and self.tokens == STREAM_TOKENS and self.finish == "length"


async def start_streams(http, server, tag: str) -> list[Stream]:
    streams = [Stream(http, server.url, f"{tag}-{n}: {PROMPT}", STREAM_TOKENS) for n in range(N_STREAMS)]
    await wait_for(
        lambda: all(st.tokens or st.task.done() for st in streams), timeout_s=120, what="every stream under way"
    )
    assert not any(st.task.done() for st in streams), "streams finished before the pause (the premise)"
    return streams


async def finish(streams: list[Stream], timeout_s: float = 180) -> None:
    await asyncio.wait_for(asyncio.gather(*(st.task for st in streams)), timeout_s)

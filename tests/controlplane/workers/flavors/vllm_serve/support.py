"""What the tests of the `vllm` flavor against stock `vllm serve` share (the fixtures are
conftest.py's): the prompts, vLLM's own calls, the state every test leaves the servers in."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rlcp.harness.hold import Hold
from rlcp.harness.http import CompletionStream, call
from rlcp.harness.servers import VllmServeProcess
from rlcp.harness.waiting import wait_for

PROMPT = "Weights move from the trainer to every engine in the fleet."
# Longer than a prefix-cache block, so a hot-swapped adapter would meet cached blocks.
LONG_PROMPT = (
    "The trainer writes weights and every engine in the fleet must load them before serving "
    "again, so the controller pauses each one, reloads, verifies and resumes; requests in "
    "flight are kept or aborted as asked. "
) * 2
STREAM_TOKENS = 240  # held, 48 s at least (support.start_streams)
N_STREAMS = 16  # per server
# Tokens per streamed chunk after the first (vLLM's per-request `stream_interval`). At one token a
# chunk, 32 streams of a tiny model send ~10k chunks a second; parsing them starved this process
# (its loop seen blocked 10 to 18 s under CI) until it read every stream late, saw them finished
# before it saw them start, and never paused with requests in flight. The first token still comes
# alone, so "under way" is seen as soon as it is true.
STREAM_INTERVAL = 16


async def complete(
    http, server: VllmServeProcess, *, model: str = "tiny", prompt: str = PROMPT, max_tokens: int = 16
) -> list[int]:
    status, body = await call(
        http,
        "POST",
        server.url + "/v1/completions",
        timeout_s=60,
        body={
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200, (server.name, body)
    return body["choices"][0]["token_ids"]


async def post(http, server: VllmServeProcess, path: str, body=None) -> dict:
    status, resp = await call(http, "POST", server.url + path, body=body, timeout_s=120)
    assert status == 200, (server.name, path, resp)
    return resp


async def reload_direct(http, server: VllmServeProcess, path: Path) -> None:
    """Straight into one server, controller aside: vLLM's own reload and a cache reset."""
    await post(http, server, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
    await post(http, server, "/reset_prefix_cache?reset_running_requests=true")


async def restore(http, servers, tiny_models) -> None:
    """What every test leaves behind: resumed, base weights, no adapters."""
    for s in servers:
        # Reload before resuming: after a failed reload the next forward would kill the engine.
        await reload_direct(http, s, tiny_models["weights-1"])
        await post(http, s, "/resume")
        status, models = await call(http, "GET", s.url + "/v1/models")
        for card in models["data"]:
            if card.get("parent"):
                await post(http, s, "/v1/unload_lora_adapter", {"lora_name": card["id"]})


def by_worker(result: dict) -> dict[str, tuple[str, str]]:
    return {r["worker_id"]: (r["status"], r["phase"]) for r in result["results"]}


async def start_streams(http, servers, tag: str, hold: Hold) -> list[CompletionStream]:
    """N_STREAMS streams per server, held (rlcp/harness/hold.py: 240 tokens take 48 s at least
    while `hold` lasts), every one seen under way: the premise of a pause with requests in flight,
    certain until the test lets them go. Fresh prompts per call, so no prefix-cache hit lets some
    requests race ahead of the others."""
    streams = [
        CompletionStream(
            http,
            s.url,
            f"{tag}-{n}: {PROMPT}",
            max_tokens=STREAM_TOKENS,
            timeout_s=180,
            name=f"stream-{s.name}-{tag}-{n}",
            stream_interval=STREAM_INTERVAL,
            xargs=hold.xargs,
        )
        for s in servers
        for n in range(N_STREAMS)
    ]
    await wait_for(
        lambda: all(st.tokens or st.task.done() for st in streams), timeout_s=60, what="every stream under way"
    )
    assert not any(st.task.done() for st in streams), [(st.error, st.finish_reason, len(st.tokens)) for st in streams]
    return streams


async def paused(http, servers) -> bool:
    """Every server says it is paused (vLLM's `GET /is_paused`: true from the moment a pause of any
    mode is taken, while a `wait` one still drains)."""
    for s in servers:
        status, body = await call(http, "GET", s.url + "/is_paused", timeout_s=10)
        if (status, body) != (200, {"is_paused": True}):
            return False
    return True


async def finish(streams: list[CompletionStream], timeout_s: float = 120) -> None:
    await asyncio.wait_for(asyncio.gather(*(st.task for st in streams)), timeout_s)


def reload_calls(server: VllmServeProcess) -> int:
    """`/collective_rpc` calls the server has answered so far (vLLM's access log)."""
    return server.log_path.read_text(errors="replace").count('"POST /collective_rpc HTTP/1.1"')

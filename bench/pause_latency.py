"""`python -m bench.pause_latency`: how long a pause takes to quiesce a busy real vLLM CPU engine.

A real agent (`python -m rlcp.agent`, vLLM CPU engine, the tests' tiny Llama) serves
`--batch` streaming-free completions at once (`ignore_eos`, `--max-tokens` each) from its
inference port; once all are running, `POST /pause?mode=` on its admin port is timed
until it answers, which it does once the mode's condition holds (abort: every request
aborted and returned; wait: every running request finished; keep: scheduling frozen),
and the agent then reports nothing running. Next to it, in the same run, the engine's
step time at that batch: the wall time of `batch` requests of `2t` tokens minus that
of `t` tokens, over `t` (prefill cancels out). The ratio pause / step time says how
many decode steps a pause costs; wait mode drains what is left, so it scales with the
tokens remaining. The agent's record of the pause (its operation's duration, i.e. vLLM's
`pause_generation`) is reported too: the difference is HTTP and the agent's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import median, plot, quiet_logs, report, table
from bench.vllm_agent import agent_config, start_agent
from rlcp.harness.checkpoints import make_models

MODES = ("abort", "wait", "keep")


async def complete(s: aiohttp.ClientSession, url: str, i: int, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "bench",
        "prompt": f"The fleet request {i} says",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with s.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=600)) as resp:
        answer = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"completion answered {resp.status}: {answer}")
        choice: dict[str, Any] = answer["choices"][0]
        return choice


async def agent_state(s: aiohttp.ClientSession, agent: Any) -> dict[str, Any]:
    async with s.get(agent.admin_url + "/v1/agent/state", headers=agent.auth) as resp:
        state: dict[str, Any] = await resp.json()
        return state


async def batch_wall(s: aiohttp.ClientSession, agent: Any, batch: int, tokens: int) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(complete(s, agent.inference_url, i, tokens) for i in range(batch)))
    return time.perf_counter() - t0


async def pause_once(
    s: aiohttp.ClientSession, infer: aiohttp.ClientSession, agent: Any, mode: str, batch: int, max_tokens: int
) -> dict[str, Any]:
    clients = [asyncio.create_task(complete(infer, agent.inference_url, i, max_tokens)) for i in range(batch)]
    deadline = time.monotonic() + 120
    while (await agent_state(s, agent))["requests"]["running"] < batch:
        if done := [c for c in clients if c.done()]:
            await done[0]  # a failed request raises here
            # The tiny model decodes a step in a few ms: too few tokens finish before all run.
            raise RuntimeError(f"a request finished before all {batch} ran at once (raise --max-tokens)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {batch} requests never all ran at once")
        await asyncio.sleep(0.005)
    t0 = time.perf_counter()
    async with s.post(
        agent.admin_url + "/pause", params={"mode": mode, "timeout_s": "300"}, headers=agent.auth
    ) as resp:
        answer = await resp.json()
    pause_s = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"pause({mode}) answered {resp.status}: {answer}")
    state = await agent_state(s, agent)
    counts = state["requests"]
    in_agent = next(op["duration_s"] for op in state["last_operations"] if op["kind"] == "pause")
    async with s.post(agent.admin_url + "/resume", headers=agent.auth) as resp:
        assert resp.status == 200, await resp.text()
    choices = await asyncio.gather(*clients)
    reasons = sorted({c["finish_reason"] for c in choices})
    return {
        "pause_s": pause_s,
        "in_agent_s": in_agent,
        "running_after": counts["running"],
        "frozen_after": counts["frozen"],
        "finish_reasons": reasons,
    }


async def run(a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    models = make_models(workdir / "models", shape=None, vocab_size=None, seeds=(1,))
    print("bench.pause_latency: starting the agent", flush=True)
    agent = start_agent(agent_config(models["base"], [workdir]), workdir / "agent")
    try:
        # Completions on a connection each: reusing keep-alive connections to the inference
        # server (uvicorn) failed requests now and then with ServerDisconnectedError. The pause
        # is timed on the admin session, its connection already open.
        async with (
            aiohttp.ClientSession() as s,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as infer,
        ):
            await batch_wall(infer, agent, a.batch, 4)  # warm-up
            steps = []
            for _ in range(a.repeats):
                short = await batch_wall(infer, agent, a.batch, a.step_tokens)
                long = await batch_wall(infer, agent, a.batch, 2 * a.step_tokens)
                steps.append((long - short) / a.step_tokens)
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
            for _ in range(a.repeats):
                for mode in MODES:
                    runs[mode].append(await pause_once(s, infer, agent, mode, a.batch, a.max_tokens))
                    r = runs[mode][-1]
                    print(
                        f"  {mode}: {r['pause_s'] * 1e3:.1f} ms (in agent {r['in_agent_s'] * 1e3:.1f} ms)", flush=True
                    )
    finally:
        agent.stop()
    step = median(steps)
    rows = []
    for mode in MODES:
        p = median([r["pause_s"] for r in runs[mode]])
        rows.append(
            {
                "mode": mode,
                "pause_s": p,
                "steps": p / step,
                "runs": runs[mode],
                "in_agent_s": median([r["in_agent_s"] for r in runs[mode]]),
                "running_after": max(r["running_after"] for r in runs[mode]),
                "frozen_after": max(r["frozen_after"] for r in runs[mode]),
                "finish_reasons": sorted({x for r in runs[mode] for x in r["finish_reasons"]}),
            }
        )
    return {
        "params": {"batch": a.batch, "max_tokens": a.max_tokens, "repeats": a.repeats, "step_tokens": a.step_tokens},
        "step_s": step,
        "step_runs_s": steps,
        "rows": rows,
    }


def render(r: dict[str, Any]) -> str:
    return table(
        [
            "mode",
            "pause → quiesced ms",
            "÷ step time",
            "in agent ms",
            "running after",
            "frozen after",
            "finish reasons",
        ],
        [
            [
                x["mode"],
                x["pause_s"] * 1e3,
                x["steps"],
                x["in_agent_s"] * 1e3 if "in_agent_s" in x else None,
                x["running_after"],
                x.get("frozen_after"),
                ",".join(x["finish_reasons"]),
            ]
            for x in r["rows"]
        ],
    )


def draw(r: dict[str, Any], out_dir: Path) -> Path:
    def d(ax: Any) -> None:
        ax.bar([x["mode"] for x in r["rows"]], [x["pause_s"] * 1e3 for x in r["rows"]], color=["C3", "C0", "C2"])
        ax.axhline(r["step_s"] * 1e3, color="grey", ls=":", label=f"one decode step at batch {r['params']['batch']}")
        ax.set_yscale("log")
        ax.set_ylabel("pause → quiesced (ms, median)")
        ax.set_title(f"Pause with {r['params']['batch']} requests in flight, vLLM CPU")
        ax.legend(fontsize=8)

    return plot("pause_latency", d, out_dir)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32, help="requests in flight")
    # The tiny model decodes 32 requests in a few ms a step: 64 tokens each are done in ~0.4 s,
    # before the benchmark sees them all running. The agent serves up to 512 tokens a sequence.
    p.add_argument("--max-tokens", type=int, default=384, help="tokens each request asks for")
    p.add_argument("--step-tokens", type=int, default=128, help="t of the step-time measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench/out)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="bench-pause-") as tmp:
        result = asyncio.run(run(a, Path(tmp)))
    return report(
        "pause_latency",
        result,
        a.out,
        text=render(result),
        draw=lambda out: draw(result, out),
        notes_before=[f"decode step at batch {a.batch}: {result['step_s'] * 1e3:.1f} ms"],
    )


if __name__ == "__main__":
    main()

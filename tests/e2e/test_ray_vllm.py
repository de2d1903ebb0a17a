"""A real vLLM CPU agent placed on a real Ray head (placement.kind ray, discovery.kind ray).

The controller (its own process, a Ray driver) keeps one agent as a detached actor; the agent
runs a vLLM CPU engine on the tiny model's base weights. Greedy outputs are exact functions of
the weights, so which weights answered is read off each answer: a disk update through the
controller changes them; then the actor's process is SIGKILLed, Ray restarts it, a fresh agent
starts its engine on the base weights, and the controller loads the desired weights into it
before the gateway sends it anything. Every answer through the gateway, before, during and
after the restart, is the updated weights' output under their version, never the base's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlcp.harness.controller import AUTH, controller_config, merge_sections, update_body
from rlcp.harness.http import free_port
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.raycluster import RayHead
from rlcp.harness.simfleet import TOKEN as AGENT_TOKEN
from rlcp.harness.tiny_model import SERVED_NAME, agent_engine
from rlcp.harness.waiting import wait_for
from tests.support.ray import ray_head

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.timeout(600)]

NAMESPACE = "rlcp-vllm"
PREFIX = "rlcp-vllm-agent-"
NAME = f"{PREFIX}0"
PROMPT = "Weights move from the trainer to every engine in the fleet."


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    with ray_head(num_cpus=2) as started:
        yield started


def config(workdir: Path, head: RayHead, models: dict[str, Path]) -> dict[str, Any]:
    agent = {
        "engine": agent_engine(models["base"]),
        "admin": {"token": AGENT_TOKEN},
        "allowed_roots": [str(models["base"].parent)],
        "log_format": "json",
    }
    config = controller_config(
        workdir,
        [],
        [models["base"].parent],
        gateway={"port": free_port()},
        **head.placed_fleet(
            NAMESPACE,
            PREFIX,
            agent,
            replicas=1,
            bundle={"CPU": 1},
            discovery={"interval_s": 0.3, "timeout_s": 3.0, "max_backoff_s": 1.0, "dead_actors": "keep"},
            placement={"interval_s": 1.0, "call_timeout_s": 200},
        ),
    )
    # a real engine's load and pause take longer than a simulated one's
    return merge_sections(
        config,
        {
            "workers": {
                "timeout_s": 10,
                "attempts": 2,
                "retry_budget_s": 20,
                "pause_timeout_s": 60,
                "weight_load_timeout_s": 120,
            }
        },
    )


async def state(http: aiohttp.ClientSession, ctl: ControllerProcess) -> dict[str, Any]:
    async with http.get(f"{ctl.url}/v1/rl/state", headers=AUTH) as resp:
        return dict(await resp.json())


async def serving_at(
    http: aiohttp.ClientSession, ctl: ControllerProcess, version: str | None, not_url: str | None = None
) -> bool:
    """The one member serving, at `version` (None: any), on an agent other than `not_url`'s."""
    workers = (await state(http, ctl)).get("workers", [])
    return (
        len(workers) == 1
        and workers[0]["serving"]
        and version in (None, workers[0]["weight_version"])
        and (not_url is None or workers[0]["admin_url"] != not_url)
    )


async def complete(http: aiohttp.ClientSession, gateway: str) -> tuple[int, str, list[int]]:
    """One greedy completion through the gateway: (status, X-RL-Weight-Version, token ids)."""
    async with http.post(
        f"{gateway}/v1/completions",
        timeout=aiohttp.ClientTimeout(total=60),
        json={
            "model": SERVED_NAME,
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    ) as resp:
        body = await resp.json()
        tokens = body["choices"][0]["token_ids"] if resp.status == 200 else []
        return resp.status, resp.headers.get("X-RL-Weight-Version", ""), tokens


async def test_a_placed_vllm_agent_restarted_by_ray_is_converged_before_it_serves(
    head: RayHead, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    ctl = ControllerProcess(config(tmp_path / "ctl", head, tiny_models), tmp_path / "ctl", start_timeout_s=90)
    gateway = f"http://127.0.0.1:{ctl.config['gateway']['port']}"
    timings: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:
        try:
            t0 = time.monotonic()
            await ctl.spawn().wait_ready_async()
            await wait_for(lambda: serving_at(http, ctl, None), 240, "the placed vLLM agent serving", interval_s=0.5)
            timings["placed_to_serving_s"] = time.monotonic() - t0
            status, _, base = await complete(http, gateway)
            assert status == 200 and len(base) == 12

            async with http.post(
                f"{ctl.url}/v1/rl/update_weights",
                headers=AUTH,
                timeout=aiohttp.ClientTimeout(total=300),
                json=update_body("w2", tiny_models["weights-2"], verify=True),
            ) as resp:
                assert resp.status == 200, await resp.text()
            status, version, updated = await complete(http, gateway)
            assert (status, version) == (200, "w2") and updated != base

            # Rollouts through the restart: each answer's version and tokens kept.
            answers: list[tuple[int, str, list[int]]] = []

            async def rollouts() -> None:
                while True:
                    try:
                        answers.append(await complete(http, gateway))
                    except (aiohttp.ClientError, TimeoutError):
                        await asyncio.sleep(0.1)

            task = asyncio.create_task(rollouts())
            try:
                actor = head.actors(NAMESPACE, PREFIX)[NAME]
                old_url = (await state(http, ctl))["workers"][0]["admin_url"]
                t_kill = time.monotonic()
                os.kill(actor["pid"], signal.SIGKILL)  # the agent child dies with it (PDEATHSIG)
                await wait_for(
                    lambda: head.actors(NAMESPACE, PREFIX)[NAME]["num_restarts"] > actor["num_restarts"],
                    60,
                    "Ray restarted the actor",
                    interval_s=0.2,
                    tolerate=(KeyError,),
                )
                await wait_for(
                    lambda: serving_at(http, ctl, "w2", not_url=old_url),
                    240,
                    "the new agent converged to w2 and serving",
                    interval_s=0.5,
                )
                timings["kill_to_serving_converged_s"] = time.monotonic() - t_kill
                n = len(answers)
                await wait_for(
                    lambda: len([a for a in answers[n:] if a[0] == 200]) >= 3, 60, "answers from the restarted agent"
                )
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            ok = [a for a in answers if a[0] == 200]
            assert ok and all((version, tokens) == ("w2", updated) for _, version, tokens in ok), [
                (v, t == base) for _, v, t in ok
            ]
            # Not ready while it loads: the gateway held or refused (503), never answered stale.
            assert {s for s, _, _ in answers} <= {200, 503}, {s for s, _, _ in answers}
            restarted = head.actors(NAMESPACE, PREFIX)[NAME]
            assert restarted["pid"] != actor["pid"] and json.loads(restarted["repr_name"])["agent_pid"]
        finally:
            ctl.stop()
        await wait_for(lambda: not head.actors(NAMESPACE, PREFIX), 60, "teardown removed the actor", interval_s=0.5)
    print("ray vllm timings:", json.dumps({k: round(v, 2) for k, v in timings.items()}))

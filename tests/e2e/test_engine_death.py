"""An engine that dies comes back, over real vLLM CPU engines (issue 33).

Two agents of their own (the suite's shared ones must not die), LoRA on, each bound to a core,
kept up by the harness's `ProcessSupervisor` (what a kubelet or Ray's actor restart does for a pod or
an actor), a controller with its gateway over them, the fleet at a version loaded from disk.
Two deaths:

- **The real crash**: a completion with `n: 2` and `prompt_logprobs: 0` over a prompt of ~90
  tokens kills vLLM 0.32's CPU EngineCore when LoRA is enabled (`bgmv_shrink`: an einsum size
  mismatch). Its client gets a 502 `engine_died` naming the worker, and the request is not sent
  to the other worker (which would die too). The requests that follow are answered by the other
  worker, untouched; the agent exits (status 3), is restarted, and the controller converges it
  to the fleet's version before the gateway sends it rollouts again.
- **A SIGKILL of the other engine's core process** while the first restarts, the agent itself
  untouched: the same way back (the two restarts overlap, to keep the test short).

Without `exit_on_engine_death` the agent stays up answering 503 `engine_dead` and nothing
restarts it: the first wait for the restarted worker fails.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.core.wire.agent.inference import EXIT_ENGINE_DIED
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.http import call
from rlcp.harness.processes import AgentProcess
from rlcp.harness.supervisor import ProcessSupervisor
from rlcp.harness.tiny_model import SERVED_NAME, agent_engine
from rlcp.harness.waiting import wait_for
from tests.conftest import one_core

# Four engine start-ups, two at a time: ~170 s on a quiet machine, over 300 s (the suite's default
# timeout) on one loaded by other engines.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

# The shape a released RL client sends (n samples per prompt, the prompt's logprobs for the
# reference), over a prompt long enough to reach the kernel's failing size.
KILLER = {
    "model": SERVED_NAME,
    "prompt": "The quick brown fox jumps over the lazy dog. " * 8,
    "max_tokens": 8,
    "n": 2,
    "prompt_logprobs": 0,
}
PLAIN = {"model": SERVED_NAME, "prompt": "The quick brown fox", "max_tokens": 4}


async def test_an_engine_that_dies_comes_back_converged(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    roots = [str(tiny_models["base"].parent), str(tmp_path)]
    agents = [
        AgentProcess(
            {
                "agent_id": f"mortal-{i}",
                "allowed_roots": roots,
                "log_format": "json",
                "require_desired_version": True,
                "engine": agent_engine(tiny_models["base"]),
            },
            tmp_path / f"agent-{i}",
            name=f"mortal-{i}",
            env=one_core(i),
        )
        for i in range(2)
    ]
    for agent in agents:
        agent.spawn()
    await asyncio.gather(*(a.wait_ready_async() for a in agents))
    ids = {f"w{i}": a for i, a in enumerate(agents)}
    restarts: list[tuple[str, int | None]] = []
    supervisor = ProcessSupervisor(
        agents, backoff_s=0.1, on_restart=lambda c, status, n: restarts.append((c.name, status))
    )
    supervision = asyncio.create_task(supervisor.run())
    settings = controller_settings(
        tmp_path,
        [a.spec(w) for w, a in ids.items()],
        allowed_roots=roots,
        workers={"token": agents[0].token, "timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 120},
        gateway={"port": 0, "hold_timeout_s": 30},
    )
    try:
        async with aiohttp.ClientSession() as http, TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as ctl:
            gateway = ctl.server.app[GATEWAY]
            resp = await ctl.post(
                "/v1/rl/update_weights",
                headers=AUTH,
                json={"version": "v1", "source": {"kind": "disk", "path": str(tiny_models["weights-1"])}},
            )
            assert resp.status == 200, await resp.json()
            await both_serving(ctl, gateway, "v1")

            # 1. The real crash, through the gateway.
            status, body = await call(http, "POST", gateway.url + "/v1/completions", body=KILLER, timeout_s=120)
            assert status == 502 and body["error"]["code"] == "engine_died", body
            named = re.search(r"worker (w\d)'s engine died", body["error"]["message"])
            assert named, body
            victim, survivor = named[1], ({"w0", "w1"} - {named[1]}).pop()
            survivor_pid = ids[survivor].pid
            # Not resent: the survivor's engine is alive, and it serves what comes next at once.
            for _ in range(4):
                resp = await http.post(gateway.url + "/v1/completions", json=PLAIN)
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-RL-Worker"] == survivor and resp.headers["X-RL-Weight-Version"] == "v1"
            assert ids[survivor].pid == survivor_pid and ids[survivor].running()
            status, _ = await call(http, "GET", ids[survivor].admin_url + "/healthz")
            assert status == 200
            await wait_for(
                lambda: "engine_died" in ids[victim].log_path.read_text(),
                timeout_s=10,
                what=f"{victim}'s agent saying its engine died",
            )

            # 2. While the victim restarts, the survivor's engine core is killed (its agent
            # untouched): both come back, converged, and serve.
            core = engine_core(ids[survivor].pid)
            os.kill(core.pid, signal.SIGKILL)
            for worker in (victim, survivor):
                await wait_for(
                    lambda w=worker: (ids[w].name, EXIT_ENGINE_DIED) in restarts,
                    timeout_s=60,
                    what=f"{worker}'s agent exiting with {EXIT_ENGINE_DIED} and restarted",
                )
            await both_serving(ctl, gateway, "v1")
            versions = set()
            for _ in range(6):
                resp = await http.post(gateway.url + "/v1/completions", json=PLAIN)
                assert resp.status == 200, await resp.text()
                versions.add((resp.headers["X-RL-Worker"], resp.headers["X-RL-Weight-Version"]))
            assert versions == {("w0", "v1"), ("w1", "v1")}
            assert supervisor.gave_up == []
    finally:
        supervision.cancel()
        for agent in agents:
            agent.stop()


async def both_serving(ctl: TestClient, gateway: Gateway, version: str) -> None:
    """Both workers converged to `version` (the restarted one from the desired state's disk
    source), inside the fence, and answering through the gateway."""

    async def converged() -> bool:
        resp = await ctl.get("/v1/rl/state")
        state = await resp.json()
        return (
            state["applied"]["converged"]
            and len(state["workers"]) == 2
            and all(w["reachable"] and w["ready"] and w["weight_version"] == version for w in state["workers"])
        )

    await wait_for(converged, timeout_s=240, what=f"both workers converged to {version}", interval_s=0.5)

    def fenced() -> bool:
        table = gateway.router.table(0)
        return table is not None and sorted(table.routes) == ["w0", "w1"]

    await wait_for(fenced, timeout_s=30, what="both workers inside the fence")


def engine_core(agent_pid: int) -> psutil.Process:
    """The agent's vLLM engine core: its child process that runs `EngineCore`."""
    for child in psutil.Process(agent_pid).children(recursive=True):
        if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
            return child
    raise AssertionError(f"no EngineCore process under the agent (pid {agent_pid})")

"""Rollouts through the gateway over two agents on real vLLM CPU engines, across keep and abort
update cycles, rolling updates (one worker at a time, at staleness bounds 1 and 0), and an
agent SIGKILLed and restarted on its base weights.

During a roll at bound 1 the fleet keeps answering; at bound 0 nothing sent once only the new
version was admitted is answered by the old one.

Which weights produced an answer is read off the answer itself, not the gateway's headers:
greedy completions of fixed prompts are recorded for both weight sets first (w1 is the base
model's own weights, which the restarted agent comes back with). An answer that overlapped
no update and equals the other weight set's output than the version its header names is a
response served outside the fence. One that overlapped an update may have been frozen by a
keep-mode pause and finished on the new weights: the engine's own spans
(`X-RL-Weight-Versions`) must then say so, and agree with the text.
Answers equal to no reference (a keep-mode request that straddled an update, or batch-size
numerics on the CPU) must stay a minority, and keep mode must still finish every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.http import call
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
PROMPTS = [
    "Weights move from the trainer",
    "Every rollout names its weights",
    "The fleet pauses, loads",
    "A stale worker never serves",
]


def completion(i: int) -> dict:
    return {
        "model": "tiny",
        "prompt": PROMPTS[i % len(PROMPTS)],
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }


class Rollouts:
    """Concurrent rollout loops through the gateway, each answer recorded with its headers."""

    def __init__(self, http: aiohttp.ClientSession, url: str, loops: int, admitted: Callable[[], list[str]]) -> None:
        self.http, self.url, self.admitted = http, url, admitted
        self.answers: list[dict] = []
        self.phase = "start"
        self.updates: list[tuple[float, float]] = []  # (start, end) of every update, monotonic
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._loop(i)) for i in range(loops)]

    async def _loop(self, i: int) -> None:
        n = i
        while not self._stop.is_set():
            phase, sent, admitted = self.phase, time.monotonic(), self.admitted()
            async with self.http.post(
                self.url + "/v1/completions", json=completion(n), timeout=aiohttp.ClientTimeout(total=120)
            ) as resp:
                body = await resp.json()
                choice = body["choices"][0] if resp.status == 200 else {}
                spans = json.loads(resp.headers.get("X-RL-Weight-Versions", "null"))
                self.answers.append(
                    {
                        "status": resp.status,
                        "phase": phase,
                        "ended": self.phase,
                        "prompt": n % len(PROMPTS),
                        "sent": sent,
                        "received": time.monotonic(),
                        "worker": resp.headers.get("X-RL-Worker"),
                        "admitted": {*admitted, *self.admitted()},  # by the fence at the send and at the answer
                        "version": resp.headers.get("X-RL-Weight-Version"),
                        "spans": {span["version"] for span in spans[0]} if spans else None,
                        "raw_spans": spans,
                        "text": choice.get("text"),
                        "finish": choice.get("finish_reason"),
                    }
                )
            n += len(self._tasks)

    async def answered(self, more: int, what: str) -> None:
        """Wait until `more` answers arrived from now on: rollouts ran in the phase, whatever the machine's pace."""
        goal = len(self.answers) + more
        await wait_for(lambda: len(self.answers) >= goal, timeout_s=180, what=f"{more} rollouts answered {what}")

    def overlapped_an_update(self, answer: dict) -> bool:
        return any(answer["sent"] < end and answer["received"] > start for start, end in self.updates)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), 120)


async def test_rollouts_through_the_gateway_never_leave_the_fence(
    vllm_agent, vllm_agent_b, tiny_models, tmp_path: Path
):
    agents = [vllm_agent, vllm_agent_b]
    dirs = {"w1": tiny_models["weights-1"], "w2": tiny_models["weights-2"]}
    specs = [a.spec(f"vllm-{i}") for i, a in enumerate(agents)]
    settings = controller_settings(
        tmp_path,
        specs,
        allowed_roots=[str(tiny_models["base"].parent)],
        # A keep-mode pause waits for the engine core to take it, and on two
        # cores one engine was seen starved for 36 s while the other decoded
        # (0 tokens/s, "Running: 1"): room for that, not a claim about it.
        workers={"token": vllm_agent.token, "timeout_s": 10, "pause_timeout_s": 90, "weight_load_timeout_s": 120},
        gateway={"port": 0, "hold_timeout_s": 60},
    )
    async with aiohttp.ClientSession() as http, TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as ctl:
        gateway = ctl.server.app[GATEWAY]

        async def update(version: str, mode: str = "keep", strategy: dict | None = None) -> dict:
            resp = await ctl.post(
                "/v1/rl/update_weights",
                headers=AUTH,
                json={
                    "version": version,
                    "source": {"kind": "disk", "path": str(dirs[version])},
                    "pause_mode": mode,
                    "strategy": strategy or {"type": "all_at_once"},
                },
            )
            assert resp.status == 200, await resp.json()
            return await resp.json()

        # References: every weight set's greedy answer to every prompt, through the gateway.
        refs: dict[str, list[str]] = {}
        for version in ("w2", "w1"):
            await update(version)
            await wait_for(
                lambda v=version: gateway.router.table().desired == v and len(gateway.router.table().routes) == 2,
                what=f"both workers inside the fence at {version}",
                timeout_s=30,
            )
            refs[version] = []
            for i in range(len(PROMPTS)):
                status, body = await call(http, "POST", gateway.url + "/v1/completions", body=completion(i))
                assert status == 200, body
                refs[version].append(body["choices"][0]["text"])
        assert refs["w1"] != refs["w2"], "the two weight sets answer differently"

        rollouts = Rollouts(http, gateway.url, loops=6, admitted=lambda: list(gateway.router.table().admitted))
        rolls: dict[str, tuple[float, float, dict]] = {}
        try:
            await rollouts.answered(6, "before the first update")
            for version, mode in (("w2", "keep"), ("w1", "keep"), ("w2", "abort")):
                rollouts.phase = mode
                start = time.monotonic()
                await update(version, mode)
                rollouts.updates.append((start, time.monotonic()))
                await rollouts.answered(6, f"after the {mode} update to {version}")
            # Rolling, one worker at a time: at bound 1 the other worker serves w2 meanwhile; at
            # bound 0 it is outside the fence.
            for version, bound in (("w1", 1), ("w2", 0)):
                resp = await ctl.post("/v1/rl/gateway/staleness", headers=AUTH, json={"bound": bound})
                assert resp.status == 200, await resp.json()
                rollouts.phase = f"rolling@{bound}"
                start = time.monotonic()
                result = await update(version, "keep", {"type": "rolling", "max_unavailable": 1})
                rolls[rollouts.phase] = (start, time.monotonic(), result)
                rollouts.updates.append((start, time.monotonic()))
                await rollouts.answered(6, f"after the rolling update at bound {bound}")
            # An agent dies and comes back at the same address on its base weights: until the
            # controller has loaded w2 into it, the fence must keep rollouts away from it.
            rollouts.phase = "restart"
            victim = vllm_agent_b
            ports = dict(victim.ports)
            start = time.monotonic()
            victim.kill()
            victim.config = {
                **victim.config,
                "admin": {"port": ports["admin_port"], "token": victim.token},
                "inference": {"port": ports["inference_port"]},
            }
            # Waited for with the loop blocked (the controller and the gateway with it), as before.
            # Awaited instead, with rollouts going on, this test took 165 and 185 s in two
            # fresh-clone runs (~45 s blocked) and failed two runs of three here, once with the
            # restarted agent's first output ~3 min after its spawn, past the 180 s start deadline.
            # Cause not found: the rollouts during a restart are still to be exercised.
            victim.start()
            controller = ctl.server.app[CONTROLLER]
            await wait_for(
                lambda: controller.state().applied.converged, what="the restarted agent converged", timeout_s=180
            )
            rollouts.updates.append((start, time.monotonic()))
            await rollouts.answered(6, "after the restarted agent converged")
        finally:
            await rollouts.stop()

        answers = rollouts.answers
        assert len(answers) > 40 and all(a["status"] == 200 for a in answers), Counter(a["status"] for a in answers)
        by_text = {text: version for version, texts in refs.items() for text in texts}
        # The engine names the weights of every answer with a token, and its spans agree with the text.
        assert all(a["spans"] for a in answers if a["text"]), [a for a in answers if a["text"] and not a["spans"]][:3]
        # (An answer whose tokens came from two weight sets -- frozen by a keep-mode pause, resumed on
        # the new weights -- may still equal one set's greedy text by a token's coincidence: it is
        # judged by its spans alone, below.)
        disagree = [
            a for a in answers if a["text"] in by_text and len(a["spans"]) == 1 and a["spans"] != {by_text[a["text"]]}
        ]
        assert disagree == [], [
            (
                a["worker"],
                a["version"],
                a["raw_spans"],
                by_text[a["text"]],
                a["phase"],
                a["sent"],
                a["received"],
                rollouts.updates,
            )
            for a in disagree
        ]
        # No answer from weights other than the version the fence named, unless an update ran
        # while it was in flight (a keep-mode request resumed on the new weights).
        outside = [
            a for a in answers if a["spans"] and a["spans"] != {a["version"]} and not rollouts.overlapped_an_update(a)
        ]
        assert outside == [], [
            (
                a["worker"],
                a["version"],
                a["raw_spans"],
                by_text.get(a["text"]),
                a["phase"],
                a["sent"],
                a["received"],
                rollouts.updates,
            )
            for a in outside
        ]
        # The restarted agent came back on the base weights (the same as w1's) while w2 was desired:
        # whatever it served after the restart was w2's answer.
        revived = [a for a in answers if a["phase"] == "restart" and a["worker"] == "vllm-1" and a["text"] in by_text]
        assert all(by_text[a["text"]] == "w2" for a in revived), revived[:5]
        assert {a["version"] for a in answers} <= {"w1", "w2"}
        # Rolling at bound 1: the fleet kept answering through the roll, from both versions; the
        # bubble says one of two workers served throughout. At bound 0: nothing sent once w2
        # was desired came from w1.
        start, end, result = rolls["rolling@1"]
        during = [a for a in answers if start < a["received"] < end]
        assert during and result["bubble"]["min_serving"] == 1 and result["progress"]["waves"] == 2, result
        assert all(a["version"] in ("w1", "w2") for a in during)
        start, end, result = rolls["rolling@0"]
        assert result["bubble"]["min_serving"] == 0 and result["status"] == "ok", result
        late = [a for a in answers if a["sent"] > start and a["admitted"] == {"w2"}]
        assert late and all(a["version"] == "w2" for a in late), late[:3]
        # Answers equal to no reference: a keep-mode request that straddled an update, or a batch
        # of another size summing in another order on the CPU (greedy decoding can then differ in
        # a late token). Most answers must be attributable, or the check above would prove little.
        unmatched = [a for a in answers if a["text"] not in by_text and a["finish"] != "abort"]
        assert len(unmatched) <= len(answers) // 4, Counter(a["phase"] for a in unmatched)
        # Keep mode loses no request: every one sent and answered while keep-mode cycles ran finished
        # in full (one still in flight when the abort cycle began may be aborted: that is abort).
        keep = [a for a in answers if a["phase"] == a["ended"] == "keep"]
        assert keep and all(a["finish"] == "length" for a in keep), Counter(a["finish"] for a in keep)
        assert Counter(a["worker"] for a in answers if a["phase"] == "restart")["vllm-0"] > 0
        state = controller.state()
        assert state.gateway is not None and state.gateway.rejected == 0

    # Leave the shared agents as the other tests expect them: base weights, no desired version.
    async with aiohttp.ClientSession() as http:
        for agent in agents:
            for method, path, body in (
                ("POST", "/resume", None),
                ("PUT", "/v1/agent/desired", {"weight_version": None}),
                ("POST", "/v1/agent/weights/disk", {"path": str(tiny_models["base"]), "version": "base"}),
            ):
                with contextlib.suppress(AssertionError):
                    status, resp = await call(http, method, agent.admin_url + path, body=body, headers=agent.auth)
                    assert status == 200, resp

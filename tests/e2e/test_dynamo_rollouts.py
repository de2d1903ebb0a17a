"""Rollouts over a Dynamo fleet, fenced by weight version through Dynamo's own frontend.

Everything Dynamo here is Dynamo 1.6.1's own released software (scripts/setup-dynamo.sh): two
`python -m dynamo.vllm` workers (Dynamo's own entry, on vLLM CPU engines, see
rlcp/harness/dynamo.py) and `python -m dynamo.frontend`, which serves `/v1/chat/completions`
for the model the workers registered and `GET /v1/rl/workers`. The controller finds the
workers only through that listing (`http_listing`, flavor dynamo, `inference_url` = the
frontend); its gateway sends each rollout to the frontend pinned with
`nvext.backend_instance_id` to a member inside the fence.

Which weights answered is read off the answer itself: prompts go in as token ids
(`nvext.token_data`) and the engine's completion ids come back in `nvext.engine_data`;
greedy ids of both weight sets are recorded first, through the frontend pinned to each
worker. Updates pause in `wait` mode, so no request straddles two weight sets: every answer
must be the greedy output of the version its `X-RL-Weight-Version` names.

Two workers and the frontend of the session's Dynamo fleet (`dynamo_fleet`, tests/conftest.py:
each engine starts in ~30 s; tests/controlplane/workers/flavors/test_dynamo.py uses the first
alone); each test leaves the fleet on the base weights (w1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings
from rlcp.harness.dynamo import DynamoFrontendProcess, DynamoVllmProcess
from rlcp.harness.http import call
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
PROMPTS = [[5, 17, 42, 99, 7], [200, 3, 64, 12], [77, 78, 79, 80, 81, 82], [11, 300, 250]]
MAX_TOKENS = 8


def chat(prompt: list[int], **nvext: Any) -> dict:
    # `messages` is required by the frontend's schema; with token_data the ids are the prompt.
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "-"}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "nvext": {"token_data": prompt, "extra_fields": ["engine_data"], **nvext},
    }


def completion_ids(body: dict) -> list[int]:
    return list(body["nvext"]["engine_data"]["completion_token_ids"])


async def listed(http: aiohttp.ClientSession, frontend: DynamoFrontendProcess) -> list[dict]:
    status, listing = await call(http, "GET", frontend.listing_url, timeout_s=5)
    assert status == 200, listing
    return list(listing["workers"])


@pytest.fixture(scope="module")
def fleet(dynamo_fleet):
    """Both workers of the session's Dynamo fleet (tests/conftest.py) and its frontend, which
    lists these two and no other."""
    return dynamo_fleet.use(2), dynamo_fleet.frontend


@pytest.fixture
async def http():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s


async def pinned(
    http: aiohttp.ClientSession, frontend: DynamoFrontendProcess, instance: int | str, prompt: list[int]
) -> tuple[int, Any]:
    return await call(
        http,
        "POST",
        frontend.url + "/v1/chat/completions",
        body=chat(prompt, backend_instance_id=int(instance)),
        timeout_s=60,
    )


async def references(http, frontend, instance) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        status, body = await pinned(http, frontend, instance, prompt)
        assert status == 200, body
        out.append(completion_ids(body))
    return out


@pytest.fixture
async def ctl(fleet, tiny_models, tmp_path):
    _, frontend = fleet
    settings = controller_settings(
        tmp_path,
        [],
        allowed_roots=[str(tiny_models["base"].parent)],
        discovery={
            "kind": "http_listing",
            "http_listing": {
                "url": frontend.listing_url,
                "interval_s": 0.5,
                "timeout_s": 5,
                "default_flavor": "dynamo",
                "inference_url": frontend.url,
            },
        },
        workers={
            "token": "unused-by-dynamo",
            "timeout_s": 10,
            "attempts": 2,
            "retry_budget_s": 20,
            "pause_timeout_s": 90,
            "weight_load_timeout_s": 120,
        },
        reconcile={"poll_interval_s": 0.2, "interval_s": 0.2, "backoff_initial_s": 0.5, "backoff_max_s": 4},
        gateway={"port": 0, "hold_timeout_s": 90},
    )
    async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as client:
        controller = client.server.app[CONTROLLER]

        def both_reachable() -> bool:
            workers = controller.state().workers
            return len(workers) == 2 and all(w.reachable for w in workers)

        await wait_for(both_reachable, timeout_s=60, what="the controller reaching both listed workers")
        yield client
        # Leave the fleet on the base weights, whatever the test did.
        with contextlib.suppress(Exception):
            await update(client, "w1", tiny_models)


async def update(client: TestClient, version: str, tiny_models, strategy: dict | None = None) -> dict:
    path = tiny_models["weights-1" if version == "w1" else "weights-2"]
    resp = await client.post(
        "/v1/rl/update_weights",
        headers=AUTH,
        json={
            "version": version,
            "source": {"kind": "disk", "path": str(path)},
            "pause_mode": "wait",
            "strategy": strategy or {"type": "all_at_once"},
        },
    )
    body = await resp.json()
    assert resp.status == 200, body
    return body


async def fence_holds(client: TestClient, version: str, members: int) -> None:
    gateway = client.server.app[GATEWAY]

    def ready() -> bool:
        table = gateway.router.table()
        return table is not None and table.desired == version and len(table.routes) == members

    await wait_for(ready, timeout_s=120, what=f"{members} members inside the fence at {version}")


async def engine(http, worker: DynamoVllmProcess, route: str, body: dict) -> None:
    status, answer = await call(http, "POST", f"{worker.url}/engine/{route}", body=body, timeout_s=120)
    assert status == 200 and answer["status"] == "ok", (route, answer)


async def test_the_frontend_serves_one_instance_per_pin_and_refuses_an_unknown_one(http, fleet, tiny_models, ctl):
    """What the gateway relies on, asked of Dynamo's frontend itself; then through the gateway.
    No version is desired yet (a fresh controller), so nothing converges the workers while
    one is put on w2 by hand through Dynamo's own routes."""
    workers, frontend = fleet
    entries = await listed(http, frontend)
    ids = {e["system_url"]: e["instance_id"] for e in entries}
    assert set(ids) == {w.url for w in workers}, entries
    status, models = await call(http, "GET", frontend.url + "/v1/models", timeout_s=10)
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"], models
    moved, other = workers
    base = await references(http, frontend, ids[moved.url])
    await engine(http, moved, "pause_generation", {"mode": "wait"})
    await engine(http, moved, "update_weights_from_disk", {"model_path": str(tiny_models["weights-2"])})
    await engine(http, moved, "resume_generation", {})
    w2 = await references(http, frontend, ids[moved.url])
    assert base != w2
    for _ in range(3):  # a pinned request is answered by that instance's weights, every time
        assert await references(http, frontend, ids[moved.url]) == w2
        assert await references(http, frontend, ids[other.url]) == base
    # An instance the frontend does not know: Dynamo's bare 400, which pinning.py recognises.
    status, body = await pinned(http, frontend, 12345, PROMPTS[0])
    assert (status, body) == (400, {"message": "Invalid request", "type": "Bad Request", "code": 400})
    # Through the gateway, once the controller put both on w1: `nvext` keeps the client's
    # fields (token_data, extra_fields) and the answer names the member and its version.
    await update(ctl, "w1", tiny_models)
    await fence_holds(ctl, "w1", 2)
    gateway = ctl.server.app[GATEWAY]
    seen: Counter[str] = Counter()
    for i in range(8):
        resp = await http.post(gateway.url + "/v1/chat/completions", json={**chat(PROMPTS[i % 4]), "logprobs": True})
        body = await resp.json()
        assert resp.status == 200, body
        assert resp.headers["X-RL-Weight-Version"] == "w1"
        seen[resp.headers["X-RL-Worker"]] += 1
        assert completion_ids(body) == base[i % 4]
        assert len(body["nvext"]["engine_data"]["completion_logprobs"]) == MAX_TOKENS
    assert set(seen) == {str(i) for i in ids.values()}, seen  # least outstanding used both


class Rollouts:
    """Concurrent rollout loops through the gateway, each answer recorded with its headers."""

    def __init__(self, http: aiohttp.ClientSession, url: str, loops: int, admitted: Callable[[], list[str]]) -> None:
        self.http, self.url, self.admitted = http, url, admitted
        self.answers: list[dict] = []
        self.phase = "start"
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._loop(i)) for i in range(loops)]

    async def _loop(self, i: int) -> None:
        n = i
        while not self._stop.is_set():
            phase, sent, admitted = self.phase, time.monotonic(), self.admitted()
            prompt = n % len(PROMPTS)
            async with self.http.post(
                self.url + "/v1/chat/completions", json=chat(PROMPTS[prompt]), timeout=aiohttp.ClientTimeout(total=120)
            ) as resp:
                body = await resp.json()
                self.answers.append(
                    {
                        "status": resp.status,
                        "phase": phase,
                        "prompt": prompt,
                        "sent": sent,
                        "received": time.monotonic(),
                        "worker": resp.headers.get("X-RL-Worker"),
                        "admitted": {*admitted, *self.admitted()},
                        "version": resp.headers.get("X-RL-Weight-Version"),
                        "ids": completion_ids(body) if resp.status == 200 else None,
                        "body": body,
                    }
                )
            n += len(self._tasks)

    async def answered(self, more: int, what: str) -> None:
        goal = len(self.answers) + more
        await wait_for(lambda: len(self.answers) >= goal, timeout_s=180, what=f"{more} rollouts answered {what}")

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), 120)


async def test_rollouts_during_rolling_updates_and_a_restart_never_leave_the_fence(http, fleet, tiny_models, ctl):
    workers, frontend = fleet
    gateway = ctl.server.app[GATEWAY]
    refs: dict[str, list[list[int]]] = {}
    for version in ("w2", "w1"):
        await update(ctl, version, tiny_models)
        await fence_holds(ctl, version, 2)
        instance = int(next(iter(gateway.router.table().routes)))
        refs[version] = await references(http, frontend, instance)
    assert refs["w1"] != refs["w2"]

    rollouts = Rollouts(http, gateway.url, loops=4, admitted=lambda: list(gateway.router.table().admitted))
    rolls: dict[str, tuple[float, float, dict]] = {}
    victim = workers[1]
    try:
        await rollouts.answered(4, "before the first update")
        for version, bound in (("w2", 1), ("w1", 0), ("w2", 0)):
            resp = await ctl.post("/v1/rl/gateway/staleness", headers=AUTH, json={"bound": bound})
            assert resp.status == 200, await resp.json()
            rollouts.phase = f"rolling@{bound}->{version}"
            start = time.monotonic()
            result = await update(ctl, version, tiny_models, {"type": "rolling", "max_unavailable": 1})
            rolls[rollouts.phase] = (start, time.monotonic(), result)
            await rollouts.answered(4, f"after the rolling update to {version} at bound {bound}")
        # A worker dies (SIGKILL, engine and all) and a new one starts on the base weights: a
        # new Dynamo instance, which the fence keeps out until the controller loaded w2 into it.
        rollouts.phase = "restart"
        old_id = next(str(e["instance_id"]) for e in await listed(http, frontend) if e["system_url"] == victim.url)
        victim.kill()
        victim.spawn()
        victim.wait_ready()
        entries = await wait_for(
            lambda: _new_entry(http, frontend, victim.url),
            timeout_s=60,
            what="the frontend listing the restarted worker",
        )
        new_id = str(entries["instance_id"])
        assert new_id != old_id

        def revived_inside() -> bool:
            return new_id in gateway.router.table().routes

        await wait_for(revived_inside, timeout_s=180, what="the restarted worker converged to w2 and fenced in")
        await rollouts.answered(8, "after the restarted worker converged")
        await wait_for(
            lambda: any(a["worker"] == new_id for a in rollouts.answers[-40:]),
            timeout_s=60,
            what="a rollout served by the restarted worker",
        )
    finally:
        await rollouts.stop()

    answers = rollouts.answers
    assert len(answers) > 20 and all(a["status"] == 200 for a in answers), [
        (a["status"], a["body"]) for a in answers if a["status"] != 200
    ][:3]
    # Every answer is the greedy output of the weights its header names: none outside the fence.
    wrong = [a for a in answers if a["ids"] != refs[a["version"]][a["prompt"]]]
    assert wrong == [], [
        (
            a["worker"],
            a["version"],
            a["phase"],
            a["sent"],
            a["received"],
            [v for v, r in refs.items() if r[a["prompt"]] == a["ids"]],
            rolls,
        )
        for a in wrong
    ][:5]
    # At bound 0, nothing sent once only the new version was admitted came from the old one.
    for phase, (start, _, result) in rolls.items():
        assert result["status"] == "ok" and result["progress"]["waves"] == 2, result
        if phase.startswith("rolling@0"):
            new = phase.rsplit(">", 1)[1]
            late = [a for a in answers if a["phase"] == phase and a["admitted"] == {new}]
            assert all(a["version"] == new for a in late), late[:3]
    start, end, result = rolls["rolling@1->w2"]
    assert result["bubble"]["min_serving"] == 1, result  # one of two served throughout
    assert {a["version"] for a in answers if a["phase"] == "rolling@1->w2"} <= {"w1", "w2"}
    # The restarted worker came back on w1's weights while w2 was desired: it served only w2.
    revived = [a for a in answers if a["worker"] == new_id]
    assert revived and all(a["version"] == "w2" and a["ids"] == refs["w2"][a["prompt"]] for a in revived)
    assert ctl.server.app[CONTROLLER].state().gateway.rejected == 0


async def _new_entry(http, frontend, url) -> dict | None:
    entries = [e for e in await listed(http, frontend) if e["system_url"] == url]
    return entries[0] if entries else None


async def test_a_three_turn_token_session_follows_the_updates(http, fleet, tiny_models, ctl):
    """verifiers/renderers-style tokens in, tokens out: each turn sends the whole conversation
    as ids, reads the engine's ids and logprobs back, and the version header follows the
    updates between turns."""
    _, frontend = fleet
    gateway = ctl.server.app[GATEWAY]
    conversation = list(PROMPTS[0])
    turns = []
    for version in ("w1", "w2", "w1"):
        await update(ctl, version, tiny_models)
        await fence_holds(ctl, version, len(gateway.router.table().routes) or 2)
        resp = await http.post(
            gateway.url + "/v1/chat/completions",
            json={**chat(conversation), "logprobs": True},
            headers={"X-Session-ID": "rollout-7"},
        )
        body = await resp.json()
        assert resp.status == 200, body
        ids = completion_ids(body)
        data = body["nvext"]["engine_data"]
        assert data["prompt_token_ids"] == conversation and len(data["completion_logprobs"]) == len(ids)
        worker = resp.headers["X-RL-Worker"]
        # The same ids again, pinned straight to the worker that answered: the same weights.
        status, direct = await pinned(http, frontend, worker, conversation)
        assert status == 200 and completion_ids(direct) == ids, direct
        turns.append((resp.headers["X-RL-Weight-Version"], worker, list(conversation), ids))
        conversation = conversation + ids + PROMPTS[1]  # the next user turn, as ids
    assert [t[0] for t in turns] == ["w1", "w2", "w1"]
    assert len({t[1] for t in turns}) == 1, turns  # the session stayed on one worker
    # Turn 2 was w2's answer: the fleet, back on w1, answers its prompt otherwise.
    _, worker, prompt, ids = turns[1]
    status, now = await pinned(http, frontend, worker, prompt)
    assert status == 200 and completion_ids(now) != ids, (ids, now)


async def test_a_streamed_rollout_through_the_gateway_is_the_greedy_answer(http, fleet, tiny_models, ctl):
    """`"stream": true` through the gateway to a pinned Dynamo member: the chunks arrive as the
    frontend's server-sent events, the headers name the member and its version, and the
    streamed text is the text of the same request not streamed (greedy, both members on w1)."""
    _, frontend = fleet
    await update(ctl, "w1", tiny_models)
    await fence_holds(ctl, "w1", 2)
    gateway = ctl.server.app[GATEWAY]
    members = set(gateway.router.table().routes)
    status, plain = await call(http, "POST", gateway.url + "/v1/chat/completions", body=chat(PROMPTS[2]), timeout_s=60)
    assert status == 200, plain
    text = plain["choices"][0]["message"]["content"]
    async with http.post(
        gateway.url + "/v1/chat/completions",
        json={**chat(PROMPTS[2]), "stream": True},
        timeout=aiohttp.ClientTimeout(total=60),
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream"), resp.headers
        assert resp.headers["X-RL-Weight-Version"] == "w1" and resp.headers["X-RL-Worker"] in members, resp.headers
        events = [line.decode().strip() async for line in resp.content if line.startswith(b"data: ")]
    assert events[-1] == "data: [DONE]", events[-3:]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")]
    assert len([d for d in deltas if d]) > 1, chunks  # streamed in pieces, not one answer in one event
    assert "".join(deltas) == text and text, (deltas, text)
    # And that text is the pinned worker's own greedy answer, asked of the frontend directly.
    status, direct = await pinned(http, frontend, resp.headers["X-RL-Worker"], PROMPTS[2])
    assert status == 200 and direct["choices"][0]["message"]["content"] == text, direct

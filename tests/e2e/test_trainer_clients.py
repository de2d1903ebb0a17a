"""The trainers' own clients, unchanged, against a fleet of two real vLLM CPU agents: the
controller is the admin URL, the gateway the inference URL, one API key for both.

- verifiers 0.4.0's `TrainClient` (tokens in, token ids and logprobs out, through renderers
  0.1.12's `generate()` and vLLM's `/inference/v1/generate`), driven as its interception server
  drives it: `prepare_turn` -> `get_response` -> `commit`, three turns, a weight update between
  the second and the third;
- verifiers' `EvalClient` (chat completions) for a three-turn chat rollout;
- prime-rl's admin calls, replayed from its source (`src/prime_rl/utils/client.py` at commit
  559b44772 of PrimeIntellect-ai/prime-rl; prime-rl is not on PyPI): `GET /health` on both
  URLs, `GET /v1/models` listing the model, `POST /pause?mode=keep&clear_cache=false`, the
  `NCCL_READY` marker written into the weight directory, `POST /update_weights {"weight_dir"}`,
  `POST /resume`, `POST /load_lora_adapter`, `POST /v1/unload_lora_adapter`, and its prefill
  scorer (`prompt_logprobs` through `/inference/v1/generate`, parsed with vLLM's own model);
- a step's rollouts with distinct sessions and one `cache_salt` (prime-rl salts every rollout
  of a step with the policy version) land on both workers.

The clients hide response headers; an httpx event hook on each client's own connection reads
`X-RL-Worker` and `X-RL-Weight-Version` off the answers they received.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.harness.controller import CTL_TOKEN, controller_settings

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

KEY_VAR = "RLCP_TRAINER_API_KEY"  # the one env var both clients read their key from, as prime-rl configures
GATEWAY_TOKEN = "rollouts-only"  # the gateway's own token: the controller's must pass too


@dataclass
class Fleet:
    ctl: TestClient
    admin_url: str  # the controller: prime-rl's admin_base_url
    inference_url: str  # the gateway + /v1: the clients' base_url
    models: dict[str, Path]
    root: Path  # under the allowed roots: the trainer's checkpoints go here


@dataclass
class Seen:
    """Headers of every answer a client received, by route."""

    answers: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    async def hook(self, response: httpx.Response) -> None:
        self.answers.append((response.request.url.path, dict(response.headers)))

    def on(self, suffix: str) -> list[dict[str, str]]:
        return [h for path, h in self.answers if path.endswith(suffix)]


@pytest.fixture
async def fleet(vllm_agent, vllm_agent_b, tiny_models, tmp_path, monkeypatch) -> AsyncIterator[Fleet]:
    monkeypatch.setenv(KEY_VAR, CTL_TOKEN)
    root = tiny_models["base"].parent
    specs = [a.spec(f"vllm-{i}") for i, a in enumerate([vllm_agent, vllm_agent_b])]
    settings = controller_settings(
        tmp_path,
        specs,
        allowed_roots=[str(root)],
        workers={"token": vllm_agent.token, "timeout_s": 10, "pause_timeout_s": 30, "weight_load_timeout_s": 120},
        gateway={"port": 0, "hold_timeout_s": 60, "token": GATEWAY_TOKEN},
    )
    async with TestClient(TestServer(assemble(settings, token=CTL_TOKEN))) as ctl:
        gateway = ctl.server.app[GATEWAY]
        fleet = Fleet(
            ctl=ctl,
            admin_url=str(ctl.make_url("")).rstrip("/"),
            inference_url=f"{gateway.url}/v1",
            models=tiny_models,
            root=root,
        )
        # A known start whatever earlier modules left on these shared agents: base weights, no adapters.
        async with PrimeRlAdmin(fleet.admin_url) as admin:
            await admin.check_health(extra=[gateway.url])
            for name in (await (await ctl.get("/v1/rl/state")).json())["desired"]["loras"]:
                await admin.unload_lora_adapter(name)
            await admin.update_weights(checkpoint(fleet, "weights-1"))
        yield fleet


def checkpoint(fleet: Fleet, weights: str) -> Path:
    """A fresh step directory (its name is the version), as a trainer writes one per step."""
    step = fleet.root / f"step-{weights}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(fleet.models[weights], step)
    return step


class PrimeRlAdmin:
    """prime-rl's admin calls (`src/prime_rl/utils/client.py`, commit 559b44772), as its
    `InferencePool` makes them with `admin_base_url` pointing at the controller: httpx clients
    with the API key as a Bearer token, the `/v1` suffix stripped, `raise_for_status()` on each."""

    def __init__(self, admin_url: str) -> None:
        self.client = httpx.AsyncClient(
            base_url=admin_url.rstrip("/").removesuffix("/v1"),
            headers={"Authorization": f"Bearer {CTL_TOKEN}"},
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=1),
            timeout=httpx.Timeout(None),
        )

    async def __aenter__(self) -> PrimeRlAdmin:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.aclose()

    async def check_health(self, extra: list[str] = (), timeout_s: int = 60) -> None:
        """`check_health`: every admin URL and, with admin URLs set, the router (the gateway),
        each polled once a second until it answers 2xx. prime-rl skips a URL whose `/health`
        is 404 (it logs a warning); here that is a failure, as the route must exist."""
        for base in [str(self.client.base_url), *extra]:
            async with httpx.AsyncClient(
                base_url=base, headers=self.client.headers, timeout=httpx.Timeout(None)
            ) as probe:
                for _ in range(timeout_s):
                    response = await probe.get("/health")
                    assert response.status_code != 404, f"{base}/health does not exist"
                    if response.is_success:
                        break
                    await asyncio.sleep(1)
                response.raise_for_status()

    async def has_model(self, name: str) -> bool:
        """`maybe_check_has_model`."""
        models = (await self.client.get("/v1/models")).json()["data"]
        return any(model["id"] == name for model in models)

    async def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        """`_admin_post`, one attempt (the test wants the first answer, not tenacity's last)."""
        response = await self.client.post(
            path, timeout=httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=10.0), **kwargs
        )
        response.raise_for_status()
        return response

    async def update_weights(self, weight_dir: Path) -> None:
        """`update_weights` without a LoRA: pause (keep), the NCCL_READY marker, the update, resume."""
        await self._post("/pause", params={"mode": "keep", "clear_cache": "false"})
        try:
            (weight_dir / "NCCL_READY").touch()
            await self._post("/update_weights", json={"weight_dir": weight_dir.as_posix()})
        finally:
            await self._post("/resume")

    async def load_lora_adapter(self, lora_name: str, lora_path: Path) -> None:
        await self._post("/load_lora_adapter", json={"lora_name": lora_name, "lora_path": lora_path.as_posix()})

    async def unload_lora_adapter(self, lora_name: str) -> None:
        await self._post("/v1/unload_lora_adapter", json={"lora_name": lora_name})


def train_client(fleet: Fleet, seen: Seen) -> Any:
    from verifiers.v1.clients.train import TrainClient
    from verifiers.v1.configs.client import TrainClientConfig

    # prime-rl's setup_client for the renderer client type: the renderer pinned to the base model
    # (its tokenizer), so an adapter name never drives tokenizer loading.
    client = TrainClient(
        TrainClientConfig(
            base_url=fleet.inference_url, api_key_var=KEY_VAR, renderer_model_name=str(fleet.models["base"])
        )
    )
    client.client._client.event_hooks["response"].append(seen.hook)  # the SDK's own httpx connection
    return client


def eval_client(fleet: Fleet, seen: Seen) -> Any:
    from verifiers.v1.clients.eval import EvalClient
    from verifiers.v1.configs.client import EvalClientConfig

    client = EvalClient(EvalClientConfig(base_url=fleet.inference_url, api_key_var=KEY_VAR))
    client.client.event_hooks["response"].append(seen.hook)
    return client


def new_trace() -> Any:
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    return Trace(task=TraceTask(type="Task", data={}), agent=AgentInfo(config={}))


async def take_turn(client: Any, trace: Any, messages: list[dict], *, model: str = "tiny", **sampling: Any) -> Any:
    """One turn as verifiers' interception server runs it: the trace resolves the prompt's prefix,
    the client samples it under the rollout's session (the trace id), the turn is committed."""
    from verifiers.v1.dialects import ChatDialect
    from verifiers.v1.graph import prepare_turn
    from verifiers.v1.types import SamplingConfig

    dialect = ChatDialect()
    body = {"model": model, "messages": messages}
    request = dialect.parse_request(body)
    turn = prepare_turn(trace, request.messages, request.tools)
    response = await client.get_response(
        dialect,
        body,
        SamplingConfig(**({"max_tokens": 8, "temperature": 0.0} | sampling)),
        session_id=trace.id,
        turn=turn,
    )
    turn.commit(response)
    messages.append({"role": "assistant", "content": response.message.content or ""})
    return response


def assert_tokens(response: Any) -> None:
    tokens = response.tokens
    assert tokens.prompt_ids and tokens.completion_ids
    assert len(tokens.completion_logprobs) == len(tokens.completion_ids)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in tokens.completion_logprobs)


async def test_a_tokens_in_tokens_out_rollout_across_an_update_and_an_adapter(fleet: Fleet):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(fleet.models["base"])
    seen = Seen()
    client = train_client(fleet, seen)
    gateway_root = fleet.inference_url.removesuffix("/v1")
    try:
        async with PrimeRlAdmin(fleet.admin_url) as admin:
            await admin.check_health(extra=[gateway_root])
            assert await admin.has_model("tiny")
            first = (await (await fleet.ctl.get("/v1/rl/state")).json())["desired"]["weight_version"]

            trace, messages, responses = new_trace(), [], []
            for turn, text in enumerate(
                ["The trainer writes weights", "Then the fleet loads them", "And every rollout names its version"]
            ):
                if turn == 2:  # a training step between the second turn and the third
                    step = checkpoint(fleet, "weights-2")
                    await admin.update_weights(step)
                messages.append({"role": "user", "content": text})
                responses.append(await take_turn(client, trace, messages))

            answers = seen.on("/inference/v1/generate")
            assert len(answers) == 3
            # The session stays on its worker; the version header follows the update.
            assert len({h["x-rl-worker"] for h in answers}) == 1
            assert [h["x-rl-weight-version"] for h in answers] == [first, first, step.name]
            assert [json.loads(h["x-rl-weight-versions"])[0][0]["version"] for h in answers] == [
                first,
                first,
                step.name,
            ]
            for response in responses:
                assert_tokens(response)
            # Tokens in: each turn's prompt is the conversation so far, in the tokenizer's ids.
            for response, text in zip(
                responses,
                ["The trainer writes weights", "Then the fleet loads them", "And every rollout names its version"],
            ):
                assert text in tokenizer.decode(response.tokens.prompt_ids)
            assert (
                responses[1].tokens.prompt_ids[: len(responses[0].tokens.prompt_ids)] == responses[0].tokens.prompt_ids
            )

            # A LoRA turn: prime-rl loads the adapter through the admin URL, then samples it by name.
            await admin.load_lora_adapter("policy-lora", fleet.models["lora-11"])
            assert await admin.has_model("policy-lora")
            messages.append({"role": "user", "content": "Now through the adapter"})
            lora_answer = await take_turn(client, trace, messages, model="policy-lora")
            assert_tokens(lora_answer)
            assert seen.on("/inference/v1/generate")[-1]["x-rl-weight-version"] == step.name
            await admin.unload_lora_adapter("policy-lora")
            assert not await admin.has_model("policy-lora")
            state = await (await fleet.ctl.get("/v1/rl/state")).json()
            assert all(not w["loras"] for w in state["workers"])  # removed from the engines, not just unlisted
    finally:
        await client.close()


async def test_a_chat_rollout_with_verifiers_eval_client(fleet: Fleet):
    from verifiers.v1.dialects import ChatDialect
    from verifiers.v1.types import SamplingConfig

    seen = Seen()
    client = eval_client(fleet, seen)
    session = "chat-rollout-1"
    messages: list[dict] = []
    try:
        for text in ["Hello fleet", "Which weights answer?", "Thank you"]:
            messages.append({"role": "user", "content": text})
            body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0.0, "logprobs": True}
            response = await client.get_response(ChatDialect(), body, SamplingConfig(), session_id=session)
            assert response.raw["choices"][0]["message"]["content"] is not None
            messages.append({"role": "assistant", "content": response.message.content or ""})
        answers = seen.on("/chat/completions")
        assert len(answers) == 3 and all(h["x-rl-weight-version"] for h in answers)
        assert len({h["x-rl-worker"] for h in answers}) == 1  # X-Session-ID keeps the rollout on one worker
    finally:
        await client.close()


async def test_a_steps_rollouts_with_one_cache_salt_use_every_worker(fleet: Fleet):
    """prime-rl salts every rollout of a step with the policy version; verifiers names each
    rollout's session by its trace id. Eight concurrent rollouts, one salt: both workers serve."""
    seen = Seen()
    client = train_client(fleet, seen)
    try:

        async def rollout(i: int) -> None:
            trace = new_trace()
            trace.id = f"rollout-{i}"  # fixed ids: where each lands is decided by hashing, so the test is repeatable
            await take_turn(
                client, trace, [{"role": "user", "content": f"Rollout number {i}"}], cache_salt="policy-step-7"
            )

        await asyncio.gather(*(rollout(i) for i in range(8)))
        workers = [h["x-rl-worker"] for h in seen.on("/inference/v1/generate")]
        assert len(workers) == 8 and set(workers) == {"vllm-0", "vllm-1"}, workers
    finally:
        await client.close()


async def test_prefill_scoring_and_streamed_spans_through_the_gateway(fleet: Fleet):
    """prime-rl's prefill scorer (`prefill_logprobs`: `prompt_logprobs` through the tokens route,
    parsed by vLLM's own `GenerateResponse`), and the spans a stream carries on its last chunk.
    prime-rl calls `GenerateResponse.model_validate_json`, written for the vLLM its own server
    runs; in vLLM 0.32 that name is a tagged union of two models, so the same type is read
    through a `TypeAdapter` here."""
    from openai import AsyncOpenAI
    from pydantic import TypeAdapter
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateResponse

    openai = AsyncOpenAI(base_url=fleet.inference_url, api_key=CTL_TOKEN)
    try:
        token_ids = [5, 17, 42, 99, 7]
        raw = await openai.post(
            f"{fleet.inference_url.removesuffix('/v1')}/inference/v1/generate",
            cast_to=httpx.Response,
            body={
                "model": "tiny",
                "token_ids": token_ids,
                "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": 1},
            },
        )
        scored = TypeAdapter(GenerateResponse).validate_json(raw.content)
        assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == len(token_ids)
    finally:
        await openai.close()

    state = await (await fleet.ctl.get("/v1/rl/state")).json()
    version = state["desired"]["weight_version"]
    auth = {"Authorization": f"Bearer {CTL_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        for path, body in (
            (
                "/v1/chat/completions",
                {"model": "tiny", "messages": [{"role": "user", "content": "stream"}], "max_tokens": 6, "stream": True},
            ),
            ("/v1/completions", {"model": "tiny", "prompt": "stream", "max_tokens": 6, "stream": True}),
            (
                "/inference/v1/generate",
                {
                    "model": "tiny",
                    "token_ids": token_ids,
                    "stream": True,
                    "sampling_params": {"max_tokens": 6, "logprobs": 1},
                },
            ),
        ):
            async with http.post(fleet.inference_url.removesuffix("/v1") + path, json=body, headers=auth) as resp:
                assert resp.status == 200, await resp.text()
                events = [
                    json.loads(line[6:]) for line in (await resp.text()).splitlines() if line.startswith("data: {")
                ]
            finishing = [c for e in events for c in e["choices"] if c.get("finish_reason")]
            assert len(finishing) == 1 and events[-1]["choices"] == finishing, path  # the last chunk
            assert finishing[0]["weight_versions"] == [{"version": version, "start": 0, "end": 6}], path
            if path == "/inference/v1/generate":  # logprob entries named for renderers, vLLM's fields kept
                entries = [
                    x for e in events for c in e["choices"] for x in (c.get("logprobs") or {}).get("content", [])
                ]
                assert entries and all(x["token"] == f"token_id:{x['token_id']}" for x in entries)

"""SimEngine's inference app (`rlcp/agent/engine/sim_inference.py`): models, completions,
streaming, and bad bodies refused naming the field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.engine.sim_inference import build_sim_inference_app
from tests.agent.engine.sim_support import adapter_dir, run

pytestmark = pytest.mark.asyncio


# -- inference app ---------------------------------------------------------------------------------
@pytest_asyncio.fixture
async def client(sim: SimEngine) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(build_sim_inference_app(sim))) as c:
        yield c


async def test_models_and_completions(sim: SimEngine, client: TestClient, tmp_path: Path) -> None:
    await sim.add_lora("sql", 1, adapter_dir(tmp_path, "ad", b"a"), replace=False)
    models = await (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["sim-model", "sql"]
    assert models["data"][1]["parent"] == "sim-model"

    resp = await client.post("/v1/completions", json={"model": "sim-model", "prompt": "hi", "max_tokens": 5})
    assert resp.status == 200
    choice = (await resp.json())["choices"][0]
    expected = (await run(sim, "direct", prompt=list(b"hi"), max_tokens=5)).token_ids
    assert choice["token_ids"] == expected and choice["finish_reason"] == "length"
    assert choice["text"] == "".join(f" t{t}" for t in expected)

    resp = await client.post("/v1/completions", json={"model": "sql", "prompt": [104, 105], "max_tokens": 5})
    lora_tokens = (await resp.json())["choices"][0]["token_ids"]
    assert lora_tokens == (await run(sim, "d2", prompt=[104, 105], max_tokens=5, lora_name="sql")).token_ids
    assert lora_tokens != expected


async def test_streaming_completion(sim: SimEngine, client: TestClient) -> None:
    resp = await client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": "hey", "max_tokens": 6, "stream": True}
    )
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in (await resp.text()).split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert (
        sum((c["token_ids"] for c in chunks), []) == (await run(sim, "d", prompt=list(b"hey"), max_tokens=6)).token_ids
    )
    assert chunks[-1]["finish_reason"] == "length" and all(c["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model": "sim-model", "prompt": "", "max_tokens": 3}, 400, "prompt"),
        ({"model": "sim-model", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "sim-model", "prompt": ["a"], "max_tokens": 3}, 400, "prompt"),
        ({"prompt": "x"}, 400, "model"),
        ([1, 2], 400, "body"),
        ({"model": "nope", "prompt": "x"}, 404, "model"),
    ],
)
async def test_bad_completion_bodies(client: TestClient, body: object, status: int, field: str) -> None:
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == status
    error = (await resp.json())["error"]
    assert error["field"] == field and error["message"]
    if status == 400:
        assert error["code"] == "bad_request"


async def test_non_json_body_is_400(client: TestClient) -> None:
    resp = await client.post("/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["error"]["field"] == "body"

"""SimEngine: the simulated engine keeps vLLM AsyncLLM's semantics, and its inference app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from rlcp.agent.engine.base import Engine, EngineError
from rlcp.agent.engine.sim import SimEngine, SimOutput
from rlcp.agent.engine.sim_inference import build_sim_inference_app
from rlcp.core.wire.agent import RequestCounts

pytestmark = pytest.mark.asyncio

PROMPT = [1, 2, 3, 4]


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimEngine]:
    engine = SimEngine(token_interval_s=0.002, max_running=4)
    await engine.start()
    yield engine
    await engine.shutdown()


async def run(
    engine: SimEngine,
    request_id: str,
    *,
    max_tokens: int = 8,
    prompt: list[int] = PROMPT,
    lora_name: str | None = None,
    seen: list[SimOutput] | None = None,
) -> SimOutput:
    """Drive one request to its end; returns the final output."""
    last = None
    async for last in engine.generate(prompt, max_tokens=max_tokens, request_id=request_id, lora_name=lora_name):
        if seen is not None:
            seen.append(last)
    assert last is not None and last.finished
    return last


async def until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


def weights_dir(root: Path, name: str, content: bytes) -> Path:
    d = root / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(content)
    return d


def adapter_dir(root: Path, name: str, content: bytes) -> Path:
    d = root / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (d / "adapter_model.safetensors").write_bytes(content)
    return d


def sim_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("sim-engine")]


# -- requests ------------------------------------------------------------------------------
async def test_is_an_engine_and_generates_deterministic_tokens(sim: SimEngine) -> None:
    assert isinstance(sim, Engine) and sim.kind == "sim" and sim.model_name == "sim-model"
    assert sim.world_size() == 1 and SimEngine(world_size=4).world_size(include_dp=False) == 4
    seen: list[SimOutput] = []
    a = await run(sim, "a", max_tokens=12, seen=seen)
    b = await run(sim, "b", max_tokens=12)
    other = await run(sim, "c", max_tokens=12, prompt=[9, 9])
    assert a.finish_reason == "length" and len(a.token_ids) == 12
    assert all(0 <= t < 1000 for t in a.token_ids)
    assert a.token_ids == b.token_ids != other.token_ids
    assert a.weight_versions == [("default", 0, 12)]
    # Cumulative outputs that only grow, spans only on the final one.
    assert [len(o.token_ids) for o in seen] == sorted(len(o.token_ids) for o in seen)
    assert all(not o.finished and o.weight_versions == [] for o in seen[:-1])
    assert sim.request_counts() == RequestCounts()


async def test_tokens_do_not_depend_on_other_engines_or_timing() -> None:
    fast, slow = SimEngine(token_interval_s=0), SimEngine(token_interval_s=0.003, max_running=1)
    await fast.start()
    await slow.start()
    try:
        a = await run(fast, "x", max_tokens=6)
        b = await run(slow, "y", max_tokens=6)
        assert a.token_ids == b.token_ids
    finally:
        await fast.shutdown()
        await slow.shutdown()


async def test_at_most_max_running_run_and_the_rest_wait_fifo(sim: SimEngine) -> None:
    tasks = [asyncio.create_task(run(sim, f"r{i}", max_tokens=40 if i < 4 else 5)) for i in range(6)]
    await until(lambda: sim.request_counts().running == 4)
    assert sim.request_counts() == RequestCounts(running=4, waiting=2)
    outs = await asyncio.gather(*tasks)
    assert all(o.finish_reason == "length" for o in outs)
    assert sim.request_counts() == RequestCounts()


async def test_bad_requests_are_refused(sim: SimEngine) -> None:
    for kwargs in ({"prompt": []}, {"max_tokens": 0}, {"lora_name": "nope"}):
        with pytest.raises(EngineError):
            await run(sim, "bad", **kwargs)
    task = asyncio.create_task(run(sim, "dup", max_tokens=200))
    await until(lambda: sim.request_counts().running == 1)
    with pytest.raises(EngineError, match="already in flight"):
        await run(sim, "dup")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sim.request_counts() == RequestCounts()


async def test_a_consumer_that_goes_away_aborts_its_request(sim: SimEngine) -> None:
    outputs = sim.generate(PROMPT, max_tokens=100, request_id="gone")
    first = await anext(outputs)
    assert len(first.token_ids) == 1
    await outputs.aclose()
    assert sim.request_counts() == RequestCounts()


async def test_abort_requests_by_id_and_all(sim: SimEngine) -> None:
    tasks = {rid: asyncio.create_task(run(sim, rid, max_tokens=500)) for rid in ("a", "b", "c")}
    await until(lambda: sim.request_counts().running == 3)
    await asyncio.sleep(0.01)
    assert await sim.abort_requests(["a", "unknown"]) == 1
    a = await tasks["a"]
    assert a.finish_reason == "abort" and 0 < len(a.token_ids) < 500
    assert a.weight_versions == [("default", 0, len(a.token_ids))]
    assert sim.request_counts().running == 2
    assert await sim.abort_requests(None) == 2
    assert {(await tasks[r]).finish_reason for r in ("b", "c")} == {"abort"}
    assert await sim.abort_requests([]) == 0


# -- pause modes -----------------------------------------------------------------------------
async def test_pause_abort_ends_in_flight_requests_with_partial_tokens(sim: SimEngine) -> None:
    tasks = [asyncio.create_task(run(sim, f"r{i}", max_tokens=500)) for i in range(6)]  # 4 run, 2 wait
    await until(lambda: sim.request_counts() == RequestCounts(running=4, waiting=2))
    await asyncio.sleep(0.01)
    await sim.pause("abort")
    outs = await asyncio.gather(*tasks)
    assert [o.finish_reason for o in outs] == ["abort"] * 6
    assert all(0 < len(o.token_ids) < 500 for o in outs[:4]) and all(o.token_ids == [] for o in outs[4:])
    assert await sim.is_paused() and sim.request_counts() == RequestCounts()

    # While paused, a new request is accepted but waits; resume runs it.
    late = asyncio.create_task(run(sim, "late", max_tokens=5))
    await until(lambda: sim.request_counts().waiting == 1)
    await asyncio.sleep(0.02)
    assert sim.request_counts() == RequestCounts(waiting=1) and not late.done()
    await sim.resume()
    assert not await sim.is_paused()
    assert (await late).finish_reason == "length"


async def test_pause_wait_drains_running_requests_and_keeps_queued_ones(sim: SimEngine) -> None:
    lengths = [10, 15, 25, 35]  # staggered, so slots free up while the pause drains
    running = [asyncio.create_task(run(sim, f"r{i}", max_tokens=n)) for i, n in enumerate(lengths)]
    queued = asyncio.create_task(run(sim, "q", max_tokens=3))
    await until(lambda: sim.request_counts() == RequestCounts(running=4, waiting=1))
    await sim.pause("wait")
    # Returns only once every running request finished normally, with all its tokens.
    assert all(t.done() for t in running)
    assert [len(t.result().token_ids) for t in running] == lengths
    assert {t.result().finish_reason for t in running} == {"length"}
    # As in vLLM, a request that never started stays queued until resume.
    assert sim.request_counts() == RequestCounts(waiting=1) and not queued.done()
    await sim.resume()
    assert (await queued).finish_reason == "length"


async def test_pause_wait_with_nothing_running_returns_at_once(sim: SimEngine) -> None:
    async with asyncio.timeout(0.5):
        await sim.pause("wait")
    assert await sim.is_paused()


async def test_pause_keep_freezes_requests_until_resume(sim: SimEngine) -> None:
    seen: list[SimOutput] = []
    task = asyncio.create_task(run(sim, "k", max_tokens=60, seen=seen))
    await until(lambda: len(seen) >= 3)
    await sim.pause("keep")
    frozen_at = len(seen[-1].token_ids)
    late = asyncio.create_task(run(sim, "late", max_tokens=4))
    await asyncio.sleep(0.03)  # ~15 token intervals
    assert len(seen[-1].token_ids) == frozen_at and not task.done() and not late.done()
    assert sim.request_counts() == RequestCounts(frozen=2)  # the late one counts as frozen too
    assert await sim.is_paused()
    await sim.resume()
    out = await task
    assert out.finish_reason == "length" and len(out.token_ids) == 60
    assert out.token_ids == (await run(sim, "again", max_tokens=60)).token_ids  # a pause changes no token
    assert (await late).finish_reason == "length"


async def test_keep_then_abort_aborts_the_frozen_requests(sim: SimEngine) -> None:
    task = asyncio.create_task(run(sim, "k", max_tokens=500))
    await until(lambda: sim.request_counts().running == 1)
    await sim.pause("keep")
    await sim.pause("abort")
    assert (await task).finish_reason == "abort" and sim.request_counts() == RequestCounts()


# -- weights -------------------------------------------------------------------------------
async def test_disk_weights_a_b_a_reproduce_tokens(sim: SimEngine, tmp_path: Path) -> None:
    a, b = weights_dir(tmp_path, "a", b"weights A"), weights_dir(tmp_path, "b", b"weights B")
    initial = (await run(sim, "0")).token_ids
    base_sums = await sim.weight_checksums()
    await sim.load_weights_from_disk(a)
    tokens_a, sums_a = (await run(sim, "1")).token_ids, await sim.weight_checksums()
    await sim.load_weights_from_disk(b)
    tokens_b, sums_b = (await run(sim, "2")).token_ids, await sim.weight_checksums()
    await sim.load_weights_from_disk(a)
    assert (await run(sim, "3")).token_ids == tokens_a
    assert await sim.weight_checksums() == sums_a
    assert len({tuple(initial), tuple(tokens_a), tuple(tokens_b)}) == 3
    assert len({json.dumps(s, sort_keys=True) for s in (base_sums, sums_a, sums_b)}) == 3
    assert await sim.get_weight_version() == "default"  # a reload does not rename the weights
    # Same bytes in another directory are the same weights.
    await sim.load_weights_from_disk(weights_dir(tmp_path, "a-copy", b"weights A"))
    assert (await run(sim, "4")).token_ids == tokens_a
    renamed = weights_dir(tmp_path, "a-renamed", b"weights A")
    (renamed / "model.safetensors").rename(renamed / "other.safetensors")
    await sim.load_weights_from_disk(renamed)
    assert (await run(sim, "5")).token_ids != tokens_a


async def test_disk_load_needs_safetensors(sim: SimEngine, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    for path in (empty, tmp_path / "missing", empty / "config.json"):
        with pytest.raises(EngineError, match=str(path.name)):
            await sim.load_weights_from_disk(path)


async def test_weights_changed_under_a_frozen_request_show_in_its_next_tokens(sim: SimEngine, tmp_path: Path) -> None:
    reference = (await run(sim, "ref", max_tokens=40)).token_ids
    await sim.set_weight_version("v1")
    seen: list[SimOutput] = []
    task = asyncio.create_task(run(sim, "k", max_tokens=40, seen=seen))
    await until(lambda: len(seen) >= 5)
    await sim.pause("keep")
    k = len(seen[-1].token_ids)
    assert await sim.reset_prefix_cache(include_running=False) is False  # frozen requests hold blocks
    await sim.load_weights_from_disk(weights_dir(tmp_path, "new", b"new"))
    await sim.set_weight_version("v2")
    assert await sim.reset_prefix_cache(include_running=True) is True
    assert sim.prefix_cache_resets == 1
    await sim.resume()
    out = await task
    assert out.token_ids[:k] == reference[:k] and out.token_ids[k:] != reference[k:]
    assert out.weight_versions == [("v1", 0, k), ("v2", k, 40)]


async def test_unlabelled_tokens_get_no_span() -> None:
    engine = SimEngine(token_interval_s=0, initial_weight_version=None)
    await engine.start()
    try:
        assert await engine.get_weight_version() is None
        assert (await run(engine, "x", max_tokens=3)).weight_versions == []
        assert await engine.reset_prefix_cache(include_running=False) is True
    finally:
        await engine.shutdown()


async def test_weight_transfer_protocol(sim: SimEngine) -> None:
    with pytest.raises(EngineError, match="not initialised"):
        await sim.start_weight_update()
    await sim.init_weight_transfer({"master_address": "x", "world_size": 2})
    with pytest.raises(EngineError, match="start_weight_update"):
        await sim.update_weights({"names": ["w"]})
    with pytest.raises(EngineError, match="without a matching"):
        await sim.finish_weight_update()
    base = (await run(sim, "0")).token_ids

    chunks = [{"names": ["a.weight", "b.weight"], "dtypes": ["bf16"] * 2}, {"names": ["c.weight"]}]

    async def transfer() -> list[int]:
        await sim.start_weight_update()
        for chunk in chunks:
            await sim.update_weights(chunk)
        await sim.finish_weight_update()
        return (await run(sim, f"after-{sim.weight_update_chunks}")).token_ids

    first = await transfer()
    assert sim.weight_update_chunks == 2 and sim.updated_names == ["a.weight", "b.weight", "c.weight"]
    assert first != base and await transfer() == first  # same chunks, same weights
    chunks[1] = {"names": ["c.weight"], "step": 2}
    assert await transfer() != first

    await sim.start_weight_update()
    with pytest.raises(EngineError, match="already active"):
        await sim.start_weight_update()
    # A failed chunk ends the session, as vLLM's worker does.
    sim.fail_next("update_weights", "nccl broke")
    with pytest.raises(EngineError, match="nccl broke"):
        await sim.update_weights({"names": ["x"]})
    with pytest.raises(EngineError, match="start_weight_update"):
        await sim.update_weights({"names": ["x"]})
    await sim.init_weight_transfer({"again": True})  # re-init replaces
    before = (await run(sim, "before-empty")).token_ids
    await sim.start_weight_update()
    await sim.finish_weight_update()  # an empty update leaves the weights alone
    assert (await run(sim, "after-empty")).token_ids == before


# -- LoRA ------------------------------------------------------------------------------------
async def test_lora_load_swap_remove(sim: SimEngine, tmp_path: Path) -> None:
    v1, v2 = adapter_dir(tmp_path, "v1", b"adapter 1"), adapter_dir(tmp_path, "v2", b"adapter 2")
    base = (await run(sim, "base")).token_ids
    await sim.add_lora("sql", 1, v1, replace=False)
    assert await sim.list_lora_ids() == {1} and sim.served_lora_names() == ["sql"]
    with_v1 = (await run(sim, "l1", lora_name="sql")).token_ids
    assert with_v1 != base and (await run(sim, "l1b", lora_name="sql")).token_ids == with_v1
    assert (await run(sim, "base2")).token_ids == base  # the base model is untouched

    # Adding an id already loaded without replace keeps the old adapter (vLLM only touches it).
    await sim.add_lora("sql", 1, v2, replace=False)
    assert (await run(sim, "l1c", lora_name="sql")).token_ids == with_v1
    await sim.add_lora("sql", 1, v2, replace=True)
    with_v2 = (await run(sim, "l2", lora_name="sql")).token_ids
    assert with_v2 not in (with_v1, base)
    await sim.add_lora("sql", 1, v1, replace=True)
    assert (await run(sim, "l3", lora_name="sql")).token_ids == with_v1

    await sim.remove_lora("sql", 1)
    assert await sim.list_lora_ids() == set() and sim.served_lora_names() == []
    with pytest.raises(EngineError, match="unknown LoRA"):
        await run(sim, "gone", lora_name="sql")
    await sim.remove_lora("sql", 1)  # idempotent
    assert await sim.list_lora_ids() == set()
    with pytest.raises(EngineError, match="adapter_config.json"):
        await sim.add_lora("bad", 2, tmp_path, replace=False)


async def test_a_base_weight_reload_drops_adapters_like_vllm(sim: SimEngine, tmp_path: Path) -> None:
    await sim.add_lora("sql", 7, adapter_dir(tmp_path, "ad", b"x"), replace=False)
    await sim.load_weights_from_disk(weights_dir(tmp_path, "w", b"w"))
    assert await sim.list_lora_ids() == set()
    # A request naming it loads it again from its path.
    await run(sim, "l", lora_name="sql")
    assert await sim.list_lora_ids() == {7}
    await sim.load_weights_from_disk(weights_dir(tmp_path, "w2", b"w2"))
    await sim.remove_lora("sql", 7)  # evicted already: removing is still fine
    assert await sim.list_lora_ids() == set() and sim.served_lora_names() == []


async def test_checksums_cover_the_adapters_held(sim: SimEngine, tmp_path: Path) -> None:
    def adapter_keys(sums: dict[str, str], name: str) -> dict[str, str]:
        return {k: v for k, v in sums.items() if k.startswith(f"lora:{name}:")}

    peer = SimEngine(token_interval_s=0.002)
    await peer.start()
    try:
        base = await sim.weight_checksums()
        assert await peer.weight_checksums() == base and not any(k.startswith("lora:") for k in base)
        # The same bytes from different directories, under different ids: the same checksums.
        await sim.add_lora("sql", 1, adapter_dir(tmp_path, "a", b"adapter 1"), replace=False)
        await peer.add_lora("sql", 5, adapter_dir(tmp_path, "a-copy", b"adapter 1"), replace=False)
        held = await sim.weight_checksums()
        assert adapter_keys(held, "sql") and held.keys() - base.keys() == adapter_keys(held, "sql").keys()
        assert {k: held[k] for k in base} == base  # the base keys are untouched
        assert await peer.weight_checksums() == held

        # Other bytes under the same name: the engines differ in exactly the adapter's keys.
        await peer.add_lora("sql", 5, adapter_dir(tmp_path, "b", b"adapter 2"), replace=True)
        swapped = await peer.weight_checksums()
        assert swapped.keys() == held.keys()
        assert {k for k in held if held[k] != swapped[k]} == adapter_keys(held, "sql").keys()

        # A second adapter adds its own keys; removing one removes exactly its keys.
        await sim.add_lora("chat", 2, adapter_dir(tmp_path, "c", b"adapter 2"), replace=False)
        both = await sim.weight_checksums()
        assert list(adapter_keys(both, "chat").values()) == list(adapter_keys(swapped, "sql").values())
        await sim.remove_lora("sql", 1)
        assert await sim.weight_checksums() == base | adapter_keys(both, "chat")
        # A base-weight reload evicts the adapters (as vLLM does), and their keys with them.
        await sim.load_weights_from_disk(weights_dir(tmp_path, "w", b"w"))
        assert not any(k.startswith("lora:") for k in await sim.weight_checksums())
        await run(sim, "reload", lora_name="chat")  # a request naming it loads it again
        assert adapter_keys(await sim.weight_checksums(), "chat") == adapter_keys(both, "chat")
    finally:
        await peer.shutdown()


# -- faults, latency, lifecycle -----------------------------------------------------------------
async def test_fail_next_fails_once(sim: SimEngine, tmp_path: Path) -> None:
    sim.fail_next("load_weights_from_disk", "disk on fire")
    with pytest.raises(EngineError, match="disk on fire"):
        await sim.load_weights_from_disk(weights_dir(tmp_path, "w", b"w"))
    await sim.load_weights_from_disk(tmp_path / "w")
    sim.fail_next("generate")
    with pytest.raises(EngineError, match="injected"):
        await run(sim, "x")
    await run(sim, "y")
    with pytest.raises(ValueError, match="unknown primitive"):
        sim.fail_next("load_weights")


async def test_hang_next_blocks_until_the_callers_deadline(sim: SimEngine) -> None:
    sim.hang_next("pause")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await sim.pause("abort")
    assert not await sim.is_paused()  # the hung call did nothing
    await sim.pause("abort")
    assert await sim.is_paused()


async def test_kill_makes_every_primitive_fail(sim: SimEngine) -> None:
    task = asyncio.create_task(run(sim, "inflight", max_tokens=500))
    await until(lambda: sim.request_counts().running == 1)
    sim.kill()
    assert not sim.is_alive()
    with pytest.raises(EngineError, match="engine dead"):
        await task
    for call in (
        sim.pause("abort"),
        sim.resume(),
        sim.get_weight_version(),
        sim.list_lora_ids(),
        sim.set_weight_version("v"),
        sim.start_weight_update(),
    ):
        with pytest.raises(EngineError, match="engine dead"):
            await call
    with pytest.raises(EngineError, match="engine dead"):
        await run(sim, "after")
    assert all(t.done() for t in sim_tasks())


async def test_kill_wakes_a_draining_pause(sim: SimEngine) -> None:
    task = asyncio.create_task(run(sim, "inflight", max_tokens=500))
    await until(lambda: sim.request_counts().running == 1)
    pause = asyncio.create_task(sim.pause("wait"))
    await asyncio.sleep(0.01)
    assert not pause.done()
    sim.kill()
    with pytest.raises(EngineError, match="engine dead"):
        await pause
    with pytest.raises(EngineError):
        await task


async def test_op_latency_slows_admin_primitives_not_reads() -> None:
    engine = SimEngine(op_latency_s=0.05)
    await engine.start()
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await engine.pause("abort")
        await engine.set_weight_version("v")
        assert loop.time() - t0 >= 0.1
        t0 = loop.time()
        await engine.is_paused()
        await engine.get_weight_version()
        assert loop.time() - t0 < 0.04
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await engine.resume()
        # An engine that dies during a slow call fails it.
        call = asyncio.create_task(engine.set_weight_version("w"))
        await asyncio.sleep(0.01)
        engine.kill()
        with pytest.raises(EngineError, match="engine dead"):
            await call
    finally:
        await engine.shutdown()


async def test_shutdown_aborts_requests_and_stops_its_task() -> None:
    engine = SimEngine(token_interval_s=0.002)
    with pytest.raises(EngineError, match="not started"):
        await engine.pause("abort")
    await engine.start()
    assert engine.is_alive() and len(sim_tasks()) == 1
    task = asyncio.create_task(run(engine, "x", max_tokens=500))
    await until(lambda: engine.request_counts().running == 1)
    await engine.shutdown()
    async with asyncio.timeout(1):
        assert (await task).finish_reason == "abort"
    assert not engine.is_alive() and sim_tasks() == []


async def test_many_engines_in_one_process() -> None:
    engines = [SimEngine(token_interval_s=0.001) for _ in range(200)]
    for e in engines:
        await e.start()
    try:
        outs = await asyncio.gather(*(run(e, f"r{i}", max_tokens=5) for i, e in enumerate(engines)))
        assert len({tuple(o.token_ids) for o in outs}) == 1
    finally:
        for e in engines:
            await e.shutdown()
    assert sim_tasks() == []


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

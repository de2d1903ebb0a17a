"""SimEngine keeps vLLM AsyncLLM's semantics: its requests (deterministic tokens, a running
limit, aborts), the pause modes, and its faults, latency and lifecycle. Its weights and adapters:
test_sim_weights.py; its inference app: test_sim_inference.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rlcp.agent.engine.base import Engine, EngineError
from rlcp.agent.engine.sim import SimEngine, SimOutput
from rlcp.core.wire.agent.state import RequestCounts
from tests.agent.engine.sim_support import PROMPT, run, sim_tasks, until, weights_dir

pytestmark = pytest.mark.asyncio


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
        # In the hour an admin primitive would wait, the reads answer (no bound on how fast: a
        # loaded machine's, CI's, is not the code's), and a primitive is still waiting.
        slow = SimEngine(op_latency_s=3600)
        await slow.start()
        try:
            async with asyncio.timeout(60):
                await slow.is_paused()
                await slow.get_weight_version()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.02):
                    await slow.resume()
        finally:
            await slow.shutdown()
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

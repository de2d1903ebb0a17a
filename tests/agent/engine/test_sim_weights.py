"""SimEngine's weights as vLLM's: a disk load reproduces tokens and shows in a frozen request's
next tokens, the weight-transfer protocol, and LoRA adapters (load, swap, remove, dropped by a
base reload, covered by checksums)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rlcp.agent.engine.base import EngineError
from rlcp.agent.engine.sim import SimEngine, SimOutput
from tests.agent.engine.sim_support import adapter_dir, run, until, weights_dir

pytestmark = pytest.mark.asyncio


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

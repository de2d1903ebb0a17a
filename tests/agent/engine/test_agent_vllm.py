"""The agent on a real vLLM CPU engine (tiny Llama made at test time): disk updates that
reproduce tokens, LoRA load, hot swap and unload, checksums of the weights and adapters each engine
holds (that test compares two engines: it borrows the session's second agent), readiness that
follows the desired version, and vLLM's own inference server. Pauses: test_agent_vllm_pause.py.

The engine is the session's (`vllm_agent`, tests/conftest.py: start-up costs ~30 s), so each test
first puts it in the state it needs (`agent`, conftest.py) instead of assuming an order."""

from __future__ import annotations

import hashlib
import re
import shutil

import pytest

from rlcp.agent.engine.vllm_args import build_vllm_args
from rlcp.agent.engine.vllm_worker import AdapterChecksumsExtension
from rlcp.agent.settings import EngineSettings, InferenceSettings
from rlcp.core.wire.agent.checksums import EMPTY_TENSOR_SHA256
from rlcp.harness.http import call
from tests.agent.engine.vllm_support import PROMPT, complete, state, tokenize

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


async def test_disk_update_a_b_a_reproduces_tokens(http, agent, tiny_models):
    async def update(seed: int, version: str) -> list[int]:
        status, _ = await call(
            http,
            "POST",
            agent.admin_url + "/v1/agent/weights/disk",
            headers=agent.auth,
            body={"path": str(tiny_models[f"weights-{seed}"]), "version": version},
        )
        assert status == 200
        assert (await state(http, agent))["weight_version"] == version
        assert (await call(http, "GET", agent.admin_url + "/weight_info"))[1] == {"weight_version": version}
        return (await complete(http, agent, PROMPT, 24))["token_ids"]

    async def checksums() -> dict:
        status, body = await call(
            http, "POST", agent.admin_url + "/weight_checker", headers=agent.auth, body={"action": "checksum"}
        )
        assert status == 200
        return body["checksums"]

    out_a = await update(1, "step-1")
    sums_a = await checksums()
    out_b = await update(2, "step-2")
    assert out_b != out_a
    assert await checksums() != sums_a
    assert await update(1, "step-3") == out_a
    status, body = await call(
        http,
        "POST",
        agent.admin_url + "/weight_checker",
        headers=agent.auth,
        body={"action": "compare", "baseline": sums_a},
    )
    assert (status, body) == (200, {"match": True, "mismatches": []})


async def test_lora_load_hot_swap_and_unload(http, agent, tiny_models):
    # Longer than several KV blocks, so a stale prefix-cache hit would show.
    prompt = " ".join([PROMPT] * 6)
    base = (await complete(http, agent, prompt))["token_ids"]

    async def load(name, seed, version):
        status, body = await call(
            http,
            "POST",
            agent.admin_url + "/v1/agent/loras",
            headers=agent.auth,
            body={"name": name, "path": str(tiny_models[f"lora-{seed}"]), "version": version},
        )
        assert status == 200, body
        return body

    await load("adapter", 11, "1")
    first = (await complete(http, agent, prompt, model="adapter"))["token_ids"]
    assert first != base
    assert (await complete(http, agent, prompt, model="adapter"))["token_ids"] == first  # served from cache

    info = await load("adapter", 12, "2")  # hot-swap under the same name
    assert info["version"] == "2"
    swapped = (await complete(http, agent, prompt, model="adapter"))["token_ids"]
    assert swapped != first
    assert (await complete(http, agent, prompt, model="adapter"))["token_ids"] == swapped
    # The same adapter under a name that was never cached gives the very same tokens:
    # nothing computed with the old adapter leaked into the swapped one.
    await load("fresh", 12, "2")
    assert (await complete(http, agent, prompt, model="fresh"))["token_ids"] == swapped
    st = await state(http, agent)
    assert {(l["name"], l["version"]) for l in st["loras"]} == {("adapter", "2"), ("fresh", "2")}

    # vLLM evicts adapters on a weight reload; a request naming one reloads it from its path,
    # and unloading one that was evicted still succeeds.
    status, _ = await call(
        http,
        "POST",
        agent.admin_url + "/v1/agent/weights/disk",
        headers=agent.auth,
        body={"path": str(tiny_models["weights-1"]), "version": "A"},
    )
    assert status == 200
    assert (await complete(http, agent, prompt, model="adapter"))["token_ids"] == swapped

    for name in ("adapter", "fresh"):
        status, body = await call(http, "DELETE", agent.admin_url + f"/v1/agent/loras/{name}", headers=agent.auth)
        assert status == 200
    assert body["engine_adapter_ids"] == []  # really removed from the engine
    assert (await state(http, agent))["loras"] == []
    status, _ = await call(
        http,
        "POST",
        agent.inference_url + "/v1/completions",
        body={"model": "adapter", "prompt": prompt, "max_tokens": 4},
    )
    assert status == 404
    assert (await complete(http, agent, prompt))["token_ids"] == base


async def checksums(http, agent) -> dict[str, str]:
    status, body = await call(
        http, "POST", agent.admin_url + "/weight_checker", headers=agent.auth, body={"action": "checksum"}
    )
    assert status == 200, body
    return body["checksums"]


def checkpoint_digests(directory) -> dict[str, str]:
    """sha256 of each weight as vLLM holds it, from the checkpoint on disk: its merged layers are
    the concatenation of the checkpoint's tensors along the output dimension, and the vocabulary
    (embeddings, LM head) is padded with zero rows to a multiple of 64."""
    import torch  # here, not at the top: every process that collects this file would pay ~3 s
    from safetensors.torch import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = tensors[name].shape[0]
        tensors[name] = torch.nn.functional.pad(tensors[name], (0, 0, 0, -rows % 64))
    merged = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    for name in list(tensors):
        for fused, parts in merged.items():
            if name.endswith(f".{parts[0]}.weight"):
                stem = name[: -len(f"{parts[0]}.weight")]
                tensors[f"{stem}{fused}.weight"] = torch.cat([tensors[f"{stem}{p}.weight"] for p in parts])
    return {name: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest() for name, t in tensors.items()}


async def test_every_base_checksum_is_of_the_weights_the_engine_computes_with(http, agent, tiny_models):
    """On the CPU engine vLLM moves each linear layer's weight into its kernel and leaves the
    parameter empty; the agent reads those weights back through the kernels. So every base
    tensor's checksum is the sha256 of that weight's bytes as in the checkpoint (LoRA on: the
    layers vLLM wraps are named `...base_layer.weight`), and a disk update changes every matrix."""
    rank = "dp0:pp0:pcp0:tp0:"
    for seed, version in ((2, "B"), (1, "A")):  # ends on the fixture's weights, as the other tests expect
        status, _ = await call(
            http,
            "POST",
            agent.admin_url + "/v1/agent/weights/disk",
            headers=agent.auth,
            body={"path": str(tiny_models[f"weights-{seed}"]), "version": version},
        )
        assert status == 200
        held = {
            k.removeprefix(rank).replace(".base_layer", ""): v
            for k, v in (await checksums(http, agent)).items()
            if not k.startswith("lora:")
        }
        expected = checkpoint_digests(tiny_models[f"weights-{seed}"])
        assert len(held) == 15 and EMPTY_TENSOR_SHA256 not in held.values()
        assert held == {name: expected[name] for name in held}, f"seed {seed}"
    # Every matrix differs between the seeds (the norms are ones in both): all the attention and MLP weights.
    other = checkpoint_digests(tiny_models["weights-2"])
    assert {k for k in held if held[k] != other[k]} == {k for k in held if "norm" not in k}
    assert "weight_checksums_of_empty_tensors" not in agent.log_path.read_text(errors="replace")


async def test_checksums_cover_the_adapters_each_engine_holds(http, agent, vllm_agent_b, tiny_models, tmp_path):
    """The adapter keys hash the engine's own copy: the same bytes agree across two engines,
    other bytes under the same name differ in exactly that adapter's keys, a new file on disk
    changes nothing until the engine loads it, a slot that no longer holds what the engine's copy
    says is reported, and unloading removes the keys."""
    other = vllm_agent_b  # the second session agent (the controller tests' fleet), on the same base weights
    status, _ = await call(
        http,
        "POST",
        other.admin_url + "/v1/agent/weights/disk",
        headers=other.auth,
        body={"path": str(tiny_models["weights-1"]), "version": "A"},
    )
    assert status == 200
    # A copy of lora-11 under an allowed root, whose files this test overwrites later.
    staged = tiny_models["base"].parent / f"lora-staged-{tmp_path.name}"
    shutil.copytree(tiny_models["lora-11"], staged)

    async def load(worker, name, path):
        status, body = await call(
            http,
            "POST",
            worker.admin_url + "/v1/agent/loras",
            headers=worker.auth,
            body={"name": name, "path": str(path)},
        )
        assert status == 200, body

    base = await checksums(http, agent)
    assert await checksums(http, other) == base and not [k for k in base if k.startswith("lora:")]
    try:
        await load(agent, "ck", staged)
        await load(other, "ck", tiny_models["lora-11"])
        held = await checksums(http, agent)
        rank = "dp0:pp0:pcp0:tp0:"
        # q and v of both layers, packed into qkv_proj (slices 0 and 2) as vLLM holds them.
        expected = {
            f"lora:ck:{rank}model.layers.{layer}.self_attn.qkv_proj.{part}.{s}"
            for layer in (0, 1)
            for part in ("lora_a", "lora_b")
            for s in (0, 2)
        }
        assert held.keys() - base.keys() == expected and {k: held[k] for k in base} == base
        # The values are sha256 of vLLM's tensors: A as in the file, B with alpha / r = 2 folded in.
        from safetensors.torch import load_file

        adapter = load_file(str(tiny_models["lora-11"] / "adapter_model.safetensors"))
        q = "base_model.model.model.layers.0.self_attn.q_proj"
        assert (
            held[f"lora:ck:{rank}model.layers.0.self_attn.qkv_proj.lora_a.0"]
            == hashlib.sha256(adapter[f"{q}.lora_A.weight"].numpy().tobytes()).hexdigest()
        )
        assert (
            held[f"lora:ck:{rank}model.layers.0.self_attn.qkv_proj.lora_b.0"]
            == hashlib.sha256((adapter[f"{q}.lora_B.weight"] * 2).numpy().tobytes()).hexdigest()
        )
        assert await checksums(http, other) == held  # two engines holding the same adapter agree

        # A new file at the adapter's path changes nothing until the engine loads it (a hot-swap).
        replacement = staged / "replacement.tmp"
        shutil.copy(tiny_models["lora-12"] / "adapter_model.safetensors", replacement)
        replacement.replace(staged / "adapter_model.safetensors")
        assert await checksums(http, agent) == held
        await load(agent, "ck", staged)
        swapped = await checksums(http, agent)
        assert swapped.keys() == held.keys()
        assert {k for k in held if swapped[k] != held[k]} == expected  # exactly the adapter's keys
        assert await checksums(http, other) == held

        # vLLM's copy of an adapter maps its file (copy-on-write): overwriting the file in place
        # changes that copy, not the slot the forward pass reads, until the next activation copies
        # it in. The slot audit reports the slots that no longer hold the adapter they report.
        shutil.copy(tiny_models["lora-11"] / "adapter_model.safetensors", staged / "adapter_model.safetensors")
        drifted = await checksums(http, agent)
        audit = drifted.keys() - swapped.keys()
        assert audit and all(
            re.fullmatch(
                rf"lora:ck:{rank}model\.layers\.[01]\.self_attn\.qkv_proj\."
                r"lora_[ab]_stacked\.[02]",
                k,
            )
            for k in audit
        )
        await load(agent, "ck", staged)  # loaded again: copy and slot agree, and both agents hold lora-11
        assert await checksums(http, agent) == held
    finally:  # other tests expect engines without adapters
        unloaded = [
            await call(http, "DELETE", w.admin_url + "/v1/agent/loras/ck", headers=w.auth) for w in (agent, other)
        ]
        shutil.rmtree(staged)
    assert [(status, body["engine_adapter_ids"]) for status, body in unloaded] == [(200, [])] * 2
    assert await checksums(http, agent) == base and await checksums(http, other) == base  # the keys went with them


async def test_readiness_follows_the_desired_version(http, agent, tiny_models):
    assert (await call(http, "GET", agent.admin_url + "/readyz"))[0] == 200
    status, body = await call(
        http, "PUT", agent.admin_url + "/v1/agent/desired", headers=agent.auth, body={"weight_version": "B"}
    )
    assert status == 200 and body["ready"] is False and body["desired_weight_version"] == "B"
    status, body = await call(http, "GET", agent.admin_url + "/readyz")
    assert status == 503 and "'A'" in body["reason"] and "'B'" in body["reason"]
    await call(
        http,
        "POST",
        agent.admin_url + "/v1/agent/weights/disk",
        headers=agent.auth,
        body={"path": str(tiny_models["weights-2"]), "version": "B"},
    )
    assert (await call(http, "GET", agent.admin_url + "/readyz"))[0] == 200
    assert (await call(http, "GET", agent.admin_url + "/healthz"))[0] == 200


async def test_inference_port_is_vllms_own_server(http, agent):
    status, models = await call(http, "GET", agent.inference_url + "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]
    ids = await tokenize(http, agent, PROMPT)
    status, body = await call(http, "POST", agent.inference_url + "/detokenize", body={"model": "tiny", "tokens": ids})
    assert (status, body["prompt"]) == (200, PROMPT)
    status, body = await call(
        http,
        "POST",
        agent.inference_url + "/v1/chat/completions",
        body={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0},
    )
    assert status == 200 and body["choices"][0]["finish_reason"] in ("length", "stop")
    status, _ = await call(http, "GET", agent.admin_url + "/get_world_size")
    assert status == 200


class _ExtensionWithMore(AdapterChecksumsExtension):
    """A deployment's own worker extension: it must carry the adapter checksums."""


def test_the_workers_get_the_adapter_checksums_extension(tiny_models):
    def args(**extra):
        engine = EngineSettings(model=str(tiny_models["base"]), extra_engine_args=extra)
        return build_vllm_args(engine, InferenceSettings())

    assert args().worker_extension_cls == "rlcp.agent.engine.vllm_worker.AdapterChecksumsExtension"
    own = f"{__name__}.{_ExtensionWithMore.__qualname__}"
    assert args(worker_extension_cls=own).worker_extension_cls == own
    with pytest.raises(ValueError, match="must subclass rlcp.agent.engine.vllm_worker.AdapterChecksumsExtension"):
        args(worker_extension_cls="collections.OrderedDict")

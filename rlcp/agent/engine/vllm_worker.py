"""Checksums computed inside vLLM's worker processes, where the adapters and the kernels live.

vLLM's `compute_weight_checksums` covers the base model's parameters only; the LoRA
adapters an engine holds sit beside them in the worker's LoRA manager, and on the CPU the
linear layers' weights sit inside their kernels (the parameters are left empty:
`vllm_kernel_weights`). `vllm_args` adds `AdapterChecksumsExtension` to the worker class
through vLLM's `worker_extension_cls`, and `vllm_checksums` calls its methods by name with `collective_rpc`:
`rlcp_adapter_checksums` for the adapters, `rlcp_kernel_weight_checksums` for the weights a
CPU kernel holds (keyed as vLLM keys the empty parameters, which they replace). (A callable
would also do, but vLLM sends
one only with `VLLM_ALLOW_INSECURE_SERIALIZATION=1`, which turns on pickle for every
message between the front end and the engine core; a method name needs nothing of the sort.)

What is hashed, per worker (read from vLLM 0.32's `vllm/lora/`):
- every adapter in the LoRA manager's cache (`LoRAModelManager.list_adapters()`, what
  `list_loras` reports): each tensor of `LoRAModel.loras[module]` (`lora_a`, `lora_b`; a packed
  module such as `qkv_proj` holds one per slice) and of `modules_to_save`. This is vLLM's own
  copy, after its loading (dtype, the LoRA scaling folded into `lora_b`, packing), and the one
  every activation copies into a slot from. Files on disk are not read.
- the slot an active adapter occupies in each linear layer's stacked buffers (`lora_a_stacked`,
  `lora_b_stacked`: what the forward pass reads, on CPU as on GPU) is audited against that copy:
  the adapter's region must hold the same values and the rest of the slot zeros. A slot that
  differs adds a key of its own (`<module>.lora_a_stacked.<slice>`, the digest of the whole slot),
  so a worker whose forward pass would not use the adapter it reports disagrees with its peers,
  while a sound engine's keys do not depend on which adapters hold a slot right now. Layers
  whose slot is not a plain copy of the adapter's tensors (tensor-parallel shards, MoE, the
  embedding and logits layers, packed groups vLLM splits) are not audited.

Digests are vLLM's (`compute_tensor_digests`): sha256 of the tensor's bytes, contiguous.
Tensor keys carry the worker's rank prefix (`dp0:pp0:pcp0:tp0:`), as vLLM's base keys do.
This module touches vLLM's LoRA manager by attribute (no vllm import), so a vLLM upgrade that
renames those attributes fails loudly here (`VllmEngine` turns that into an `EngineError`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlcp.agent.engine.vllm_kernel_weights import kernel_weight, repacked_layers

if TYPE_CHECKING:  # torch is imported where it runs: importing this module stays cheap for the agent
    import torch

# The collective RPC's method name; unique, since vLLM refuses an extension whose names clash.
ADAPTER_CHECKSUMS_RPC = "rlcp_adapter_checksums"
KERNEL_WEIGHT_CHECKSUMS_RPC = "rlcp_kernel_weight_checksums"


def tensor_digest(tensor: torch.Tensor) -> str:
    """As vLLM's `compute_tensor_digests`: sha256 of the tensor's bytes."""
    import torch

    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def _slices(value: Any) -> Iterator[tuple[int | None, torch.Tensor]]:
    """(slice index or None for an unpacked module, tensor) of one `lora_a` / `lora_b`."""
    if isinstance(value, list):
        for index, tensor in enumerate(value):
            if tensor is not None:
                yield index, tensor
    elif value is not None:
        yield None, value


def _registered(lora_model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    for module, weights in sorted(lora_model.loras.items()):
        for part in ("lora_a", "lora_b"):
            for index, tensor in _slices(getattr(weights, part)):
                yield f"{module}.{part}" if index is None else f"{module}.{part}.{index}", tensor
    for module, full in sorted(lora_model.modules_to_save.items()):
        yield f"{module}.weight", full.weight
        if full.bias is not None:
            yield f"{module}.bias", full.bias


def _slot_holds(slot: torch.Tensor, tensor: torch.Tensor | None) -> bool:
    """Whether a slot (2-D) holds `tensor` in its top-left corner and zeros elsewhere, as
    vLLM's `reset_lora` + `set_lora` leave it (a module or slice the adapter lacks: all zeros)."""
    import torch

    if tensor is None:
        return not bool(slot.any())
    rows, cols = tensor.shape
    return (
        torch.equal(slot[:rows, :cols], tensor.to(device=slot.device, dtype=slot.dtype))
        and not bool(slot[rows:].any())
        and not bool(slot[:rows, cols:].any())
    )


def _fits(tensor: torch.Tensor | None, buffer: torch.Tensor) -> bool:
    """Whether `set_lora` copies `tensor` as is into a slot of `buffer` (slots, 1, rows, cols)."""
    return tensor is None or (
        tensor.dim() == 2 and tensor.shape[0] <= buffer.shape[2] and tensor.shape[1] <= buffer.shape[3]
    )


def _slot_audit(manager: Any, lora_model: Any, slot_index: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(key, whole slot) of every audited slot that does not hold what the adapter says."""
    import torch

    for module_name, module in sorted(manager.modules.items()):
        if getattr(module, "tp_size", 1) != 1:
            continue  # a shard of the adapter, not a copy
        weights = lora_model.loras.get(module_name)
        for part in ("lora_a", "lora_b"):
            stacked = getattr(module, f"{part}_stacked", None)
            if not isinstance(stacked, tuple) or not all(isinstance(b, torch.Tensor) and b.dim() == 4 for b in stacked):
                break  # not a linear layer's per-slice buffers
            value = getattr(weights, part) if weights is not None else None
            if isinstance(value, list):
                expected = value
            elif value is None:  # a module the adapter leaves alone: its slot is zeroed
                expected = [None] * len(stacked)
            else:
                expected = [value]
            if len(expected) != len(stacked) or not all(map(_fits, expected, stacked)):
                break  # vLLM splits or reshapes these on the way into the slot
            for index, (buffer, tensor) in enumerate(zip(stacked, expected, strict=True)):
                if not _slot_holds(buffer[slot_index, 0], tensor):
                    yield f"{module_name}.{part}_stacked.{index}", buffer[slot_index, 0]


class AdapterChecksumsExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); `self` is the worker."""

    if TYPE_CHECKING:  # the worker's own (vLLM's `Worker`), which this mixin reads; nothing at run time
        model_runner: Any

        def _weight_checksum_prefix(self) -> str: ...

    def rlcp_adapter_checksums(self) -> dict[str, dict[str, str]]:
        """{adapter id (as text): {rank prefix + tensor key: sha256}} for every adapter held."""
        lora_manager = getattr(self.model_runner, "lora_manager", None)
        if lora_manager is None:
            return {}  # LoRA not enabled
        manager = lora_manager._adapter_manager  # vLLM's LoRAModelManager: the cache and the slots
        prefix = self._weight_checksum_prefix()
        slots = {
            adapter_id: index for index, adapter_id in enumerate(manager.lora_index_to_id) if adapter_id is not None
        }
        answer: dict[str, dict[str, str]] = {}
        for adapter_id, lora_model in sorted(manager.list_adapters().items()):
            digests = {prefix + key: tensor_digest(tensor) for key, tensor in _registered(lora_model)}
            if adapter_id in slots:
                digests |= {
                    prefix + key: tensor_digest(slot)
                    for key, slot in _slot_audit(manager, lora_model, slots[adapter_id])
                }
            answer[str(adapter_id)] = digests
        return answer

    def rlcp_kernel_weight_checksums(self) -> dict[str, str]:
        """{rank prefix + parameter name: sha256} of every weight vLLM moved into a CPU kernel,
        read back through the kernel (`vllm_kernel_weights`; costs one K-token forward per layer).
        Empty where no layer was repacked (GPU workers keep their parameters)."""
        prefix = self._weight_checksum_prefix()
        return {
            prefix + name: tensor_digest(kernel_weight(module))
            for name, module in repacked_layers(self.model_runner.get_model())
        }

"""Pre-flight checks of a safetensors checkpoint, before the engine is touched.

vLLM's in-place reload fails only after it has overwritten some weights, leaving the
engine half-updated. Reading the safetensors headers (a few KB, no tensors, no torch)
lets the agent refuse a directory that cannot cover the serving model with a 400.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_MAX_HEADER = 100 << 20  # safetensors' own limit on header size


class CheckpointError(ValueError):
    pass


def read_tensor_names(directory: Path) -> set[str]:
    """Tensor names across every *.safetensors file in `directory` (headers only)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {str(directory)!r}")
    names: set[str] = set()
    for path in files:
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise CheckpointError(f"{path.name}: not a safetensors file")
            (length,) = struct.unpack("<Q", raw_len)
            if length > _MAX_HEADER:
                raise CheckpointError(f"{path.name}: header of {length} bytes is too large")
            try:
                header = json.loads(f.read(length))
            except ValueError as exc:
                raise CheckpointError(f"{path.name}: unreadable header ({exc})") from exc
        names.update(k for k in header if k != "__metadata__")
    return names


def check_covers(directory: Path, expected: set[str]) -> None:
    """Raise CheckpointError unless the checkpoint holds every tensor in `expected`."""
    missing = expected - read_tensor_names(directory)
    if missing:
        example = ", ".join(sorted(missing)[:3])
        raise CheckpointError(f"checkpoint in {str(directory)!r} lacks {len(missing)} of the model's "
                              f"{len(expected)} tensors (e.g. {example})")

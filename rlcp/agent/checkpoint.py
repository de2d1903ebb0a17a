"""Pre-flight checks of a safetensors checkpoint, before the engine is touched.

vLLM's in-place reload fails only after it has overwritten some weights, leaving the
engine half-updated. Reading the safetensors headers (a few KB, no tensors, no torch)
lets the agent refuse a directory that cannot cover the serving model with a 400 -- and
the controller asks for exactly this check on every worker before it pauses any
(`POST /v1/agent/weights/check`), so a missing or half-written checkpoint costs nothing.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

_MAX_HEADER = 100 << 20  # safetensors' own limit on header size
INDEX_NAME = "model.safetensors.index.json"  # a sharded checkpoint's map of tensor -> file


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True)
class CheckpointSummary:
    """A checkpoint directory as one inspection found it: an update inspects once and hands
    this on, so what is loaded is the directory that was checked."""

    path: Path
    files: int
    tensors: set[str]


def inspect_checkpoint(directory: Path) -> CheckpointSummary:
    """The safetensors files in `directory` and their tensors (headers only). A sharded
    checkpoint's index must name only files that are there: a shard still being copied
    is a checkpoint not there yet."""
    files = sorted(directory.glob("*.safetensors"))
    index = directory / INDEX_NAME
    if index.exists():
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{INDEX_NAME}: unreadable ({exc})") from exc
        absent = sorted(str(s) for s in shards if not (directory / str(s)).is_file())
        if absent:
            raise CheckpointError(
                f"{INDEX_NAME} names {len(absent)} file(s) not in {str(directory)!r} (e.g. {', '.join(absent[:3])})"
            )
    if not files:
        raise CheckpointError(f"no *.safetensors files in {str(directory)!r}")
    names: set[str] = set()
    for path in files:
        try:
            with path.open("rb") as f:
                raw_len = f.read(8)
                if len(raw_len) != 8:
                    raise CheckpointError(f"{path.name}: not a safetensors file")
                (length,) = struct.unpack("<Q", raw_len)
                if length > _MAX_HEADER:
                    raise CheckpointError(f"{path.name}: header of {length} bytes is too large")
                header = json.loads(f.read(length))
        except OSError as exc:  # unreadable (permissions), or a dangling symlink
            raise CheckpointError(f"{path.name}: cannot be read ({exc.strerror or exc})") from exc
        except ValueError as exc:
            raise CheckpointError(f"{path.name}: unreadable header ({exc})") from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"{path.name}: unreadable header (not a JSON object)")
        names.update(k for k in header if k != "__metadata__")
    return CheckpointSummary(path=directory, files=len(files), tensors=names)


def read_tensor_names(directory: Path) -> set[str]:
    """Tensor names across every *.safetensors file in `directory` (headers only)."""
    return inspect_checkpoint(directory).tensors


def check_covers(directory: Path, expected: set[str]) -> CheckpointSummary:
    """The summary, or CheckpointError unless the checkpoint holds every tensor in `expected`."""
    summary = inspect_checkpoint(directory)
    missing = expected - summary.tensors
    if missing:
        example = ", ".join(sorted(missing)[:3])
        raise CheckpointError(
            f"checkpoint in {str(directory)!r} lacks {len(missing)} of the model's "
            f"{len(expected)} tensors (e.g. {example})"
        )
    return summary

"""The stable hashes `SimEngine` makes its tokens and checksums from.

Tokens and checksums are digests of what the engine holds (weights, adapter files, prompt,
tokens so far), so equal inputs agree across engines and any change shows in the output.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from rlcp.agent.engine.base import EngineError


def digest(*parts: bytes | str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))  # length-prefixed: ("ab","c") != ("a","bc")
        h.update(data)
    return h.digest()


def files_digest(files: list[Path]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(files):
        h.update(digest(f.name))
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.digest()


async def read_checkpoint(path: Path) -> bytes:
    """The digest of a checkpoint folder's *.safetensors files, read off the event loop."""
    files = list(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise EngineError(f"no *.safetensors files in {str(path)!r}")
    return await asyncio.to_thread(files_digest, files)

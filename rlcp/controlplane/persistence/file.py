"""The desired state in a local file, the default store.

Writes are atomic: a temp file in the same directory, fsync, rename -- a crash leaves the
old or the new document, never half of one. The file work runs in a thread: an fsync waits for
the disk (9 ms a write was seen on a busy one), and the event loop serves the state, the
gateway and the other operations meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from rlcp.core.wire.controller.desired import DesiredState


class FileStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def load(self) -> DesiredState | None:
        text = await asyncio.to_thread(self._read)
        return None if text is None else DesiredState.model_validate_json(text)

    async def save(self, desired: DesiredState) -> None:
        await asyncio.to_thread(self._write, desired.model_dump_json(indent=2))

    def _read(self) -> str | None:
        return self.path.read_text() if self.path.exists() else None

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

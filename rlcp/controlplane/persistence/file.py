"""The desired state in a local file, the default store.

Writes are atomic: a temp file in the same directory, fsync, rename -- a crash leaves the
old or the new document, never half of one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rlcp.core.wire.controller import DesiredState


class FileStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def load(self) -> DesiredState | None:
        if not self.path.exists():
            return None
        return DesiredState.model_validate_json(self.path.read_text())

    async def save(self, desired: DesiredState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(desired.model_dump_json(indent=2))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

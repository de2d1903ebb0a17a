"""Persistence of the desired state, so a restarted controller loses nothing.

`FileStore` (the default) writes atomically: a temp file in the same directory,
fsync, rename -- a crash leaves the old or the new document, never half of one.
The Kubernetes ConfigMap store implements the same two methods.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol

from controlplane.state import DesiredState


class DesiredStore(Protocol):
    async def load(self) -> DesiredState | None: ...

    async def save(self, desired: DesiredState) -> None: ...


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


class MemoryStore:
    """For tests of code above the store, and for `--no-persist` runs."""

    def __init__(self) -> None:
        self.saved: DesiredState | None = None

    async def load(self) -> DesiredState | None:
        return self.saved

    async def save(self, desired: DesiredState) -> None:
        self.saved = desired.model_copy(deep=True)

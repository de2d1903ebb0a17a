"""Persistence of the desired state, so a restarted controller loses nothing.

DesiredStore (Protocol)  load / save
├── FileStore            a local file, written atomically (the default)    file.py
├── MemoryStore          nothing survives the process (tests, --no-persist) memory.py
└── ConfigMapStore       a Kubernetes ConfigMap, optimistic concurrency     configmap.py
"""

from __future__ import annotations

from typing import Protocol

from rlcp.core.wire.controller.desired import DesiredState


class DesiredStore(Protocol):
    async def load(self) -> DesiredState | None: ...

    async def save(self, desired: DesiredState) -> None: ...

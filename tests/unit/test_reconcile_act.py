"""The reconciler asks a driver only for what its capabilities allow: an action whose capability
the driver lacks fails as that worker's result, naming both, and nothing is called."""

from __future__ import annotations

import pytest

from rlcp.controlplane.reconcile.loop import Reconciler
from rlcp.controlplane.reconcile.plan import Action
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus


class _StatusOnly:
    spec = WorkerSpec(id="w0", admin_url="http://127.0.0.1:9")

    async def status(self) -> WorkerStatus:
        raise AssertionError("not asked")


async def test_an_action_the_driver_cannot_take_fails_naming_both() -> None:
    reconciler = Reconciler.__new__(Reconciler)  # _act reads nothing of its collaborators for this
    with pytest.raises(TypeError, match="a _StatusOnly cannot load_lora"):
        await reconciler._act(_StatusOnly(), Action("load_lora", {"name": "a", "path": "/a", "version": None}))

"""The reconciler asks a driver only for what its capabilities allow: an action whose capability
the driver lacks fails as that worker's result, naming both, and nothing is called."""

from __future__ import annotations

from typing import get_args

import pytest

from rlcp.controlplane.reconcile.loop import Reconciler
from rlcp.controlplane.reconcile.plan import Action, ActionKind, LoadLora
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus


class _StatusOnly:
    spec = WorkerSpec(id="w0", admin_url="http://127.0.0.1:9")

    async def status(self) -> WorkerStatus:
        raise AssertionError("not asked")


async def test_an_action_the_driver_cannot_take_fails_naming_both() -> None:
    reconciler = Reconciler.__new__(Reconciler)  # _act reads nothing of its collaborators for this
    with pytest.raises(TypeError, match="a _StatusOnly cannot load_lora"):
        await reconciler._act(_StatusOnly(), LoadLora("a", "/a", None))


def test_each_action_kind_has_one_class() -> None:
    """`ActionKind` (metric and result names, deadlines) and the action classes name the same set."""
    kinds = [cls.kind for cls in get_args(Action)]
    assert sorted(kinds) == sorted(get_args(ActionKind))

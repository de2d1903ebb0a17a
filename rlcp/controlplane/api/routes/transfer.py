"""Broadcast weight updates (`/v1/rl/weight_transfer/*`): the trainer's group with the fleet, one call per step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rlcp.controlplane.api.answers import WeightTransferInfo
from rlcp.controlplane.api.handling import STEP, TRANSFER, controller_of, serve_operation
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.operations.broadcast import WeightTransfer, group_candidates
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller import (
    EmptyRequest,
    OperationResult,
    TransferFinishRequest,
    TransferInitRequest,
    TransferUpdateRequest,
)

api = RouteTable(tag=TRANSFER, context=controller_of)


async def _info(ctl: Controller, _: None) -> dict[str, object]:
    ranks = ctl.transfer.world_size()
    group = ctl.transfer.view()
    return {
        "inference_world_size": ranks,
        "trainer_world_size": ranks + 1,
        "membership_epoch": ctl.registry.membership.epoch,
        "members": [r.id for r in group_candidates(ctl.registry)],
        "group": group.model_dump(mode="json") if group else None,
    }


api.serve(
    "GET",
    "/v1/rl/weight_transfer",
    "World sizes for the trainer's init info, and the current group.",
    _info,
    ok=WeightTransferInfo,
)


def _step(path: str, summary: str, run: Callable[[WeightTransfer, Any], Awaitable[OperationResult]], **kw: Any) -> None:
    """A step of the broadcast session, run on the fleet's `WeightTransfer`: one collective on
    every worker, so any failure is 502 (`STEP`)."""
    serve_operation(api, "POST", path, summary, lambda ctl, body: run(ctl.transfer, body), partial=STEP, **kw)


def _bare_step(path: str, summary: str, run: Callable[[WeightTransfer], Awaitable[OperationResult]]) -> None:
    """A step that takes no input: a body, if sent, is an empty object (`EmptyRequest`)."""
    _step(path, summary, lambda transfer, _: run(transfer), body=EmptyRequest, body_optional=True)


_step(
    "/v1/rl/weight_transfer/init",
    "Every worker joins the trainer's group at its rank offset.",
    WeightTransfer.init,
    body=TransferInitRequest,
)
_bare_step(
    "/v1/rl/weight_transfer/start", "Open an update (pausing the fleet if the trainer did not).", WeightTransfer.start
)
_step(
    "/v1/rl/weight_transfer/update",
    "One update chunk, on every worker at once.",
    WeightTransfer.update_chunk,
    body=TransferUpdateRequest,
)
_step(
    "/v1/rl/weight_transfer/finish",
    "End the update, verify, resume what start paused.",
    WeightTransfer.finish,
    body=TransferFinishRequest,
    body_optional=True,
    errors=(403,),
)
_bare_step("/v1/rl/weight_transfer/shutdown", "Every worker leaves the group.", WeightTransfer.shutdown)

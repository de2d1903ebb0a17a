"""Broadcast weight updates (`/v1/rl/weight_transfer/*`): the trainer's group with the fleet, one call per step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rlcp.controlplane.api.answers import WeightTransferInfo
from rlcp.controlplane.api.handling import STEP, TRANSFER, controller_of, serve_operation
from rlcp.controlplane.operations.broadcast import WeightTransfer, group_candidates
from rlcp.core.http import json_response
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller import (
    EmptyRequest,
    OperationResult,
    TransferFinishRequest,
    TransferInitRequest,
    TransferUpdateRequest,
)

api = RouteTable(tag=TRANSFER)


@api.get(
    "/v1/rl/weight_transfer",
    "World sizes for the trainer's init info, and the current group.",
    ok=WeightTransferInfo,
)
async def get_weight_transfer(request: web.Request) -> web.Response:
    ctl = controller_of(request)
    transfer = ctl.transfer
    ranks = transfer.world_size()
    group = transfer.view()
    return json_response(
        {
            "inference_world_size": ranks,
            "trainer_world_size": ranks + 1,
            "membership_epoch": ctl.registry.membership.epoch,
            "members": [r.id for r in group_candidates(ctl.registry)],
            "group": group.model_dump(mode="json") if group else None,
        }
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

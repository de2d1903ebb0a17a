"""Broadcast weight updates (`/v1/rl/weight_transfer/*`): the trainer's group with the fleet, one call per step."""

from __future__ import annotations

from aiohttp import web

from rlcp.controlplane.api.answers import WeightTransferInfo
from rlcp.controlplane.api.handling import STEP, TRANSFER, controller_of, operation, operation_response
from rlcp.controlplane.operations.broadcast import group_candidates
from rlcp.core.http import json_response, parse_body
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller import EmptyRequest, TransferFinishRequest, TransferInitRequest, TransferUpdateRequest

api = RouteTable()


@api.get(
    "/v1/rl/weight_transfer",
    "World sizes for the trainer's init info, and the current group.",
    ok=WeightTransferInfo,
    tag=TRANSFER,
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


@operation(
    api,
    "POST",
    "/v1/rl/weight_transfer/init",
    "Every worker joins the trainer's group at its rank offset.",
    body=TransferInitRequest,
    partial=STEP,
    tag=TRANSFER,
)
async def post_transfer_init(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferInitRequest)
    return operation_response(await controller_of(request).transfer.init(body))


@operation(
    api,
    "POST",
    "/v1/rl/weight_transfer/start",
    "Open an update (pausing the fleet if the trainer did not).",
    body=EmptyRequest,
    body_optional=True,
    partial=STEP,
    tag=TRANSFER,
)
async def post_transfer_start(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    return operation_response(await controller_of(request).transfer.start())


@operation(
    api,
    "POST",
    "/v1/rl/weight_transfer/update",
    "One update chunk, on every worker at once.",
    body=TransferUpdateRequest,
    partial=STEP,
    tag=TRANSFER,
)
async def post_transfer_update(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferUpdateRequest)
    return operation_response(await controller_of(request).transfer.update_chunk(body))


@operation(
    api,
    "POST",
    "/v1/rl/weight_transfer/finish",
    "End the update, verify, resume what start paused.",
    body=TransferFinishRequest,
    body_optional=True,
    partial=STEP,
    errors=(403,),
    tag=TRANSFER,
)
async def post_transfer_finish(request: web.Request) -> web.Response:
    body = await parse_body(request, TransferFinishRequest, allow_empty=True)
    return operation_response(await controller_of(request).transfer.finish(body))


@operation(
    api,
    "POST",
    "/v1/rl/weight_transfer/shutdown",
    "Every worker leaves the group.",
    body=EmptyRequest,
    body_optional=True,
    partial=STEP,
    tag=TRANSFER,
)
async def post_transfer_shutdown(request: web.Request) -> web.Response:
    await parse_body(request, EmptyRequest, allow_empty=True)
    return operation_response(await controller_of(request).transfer.shutdown())

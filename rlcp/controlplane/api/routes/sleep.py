"""Sleep, wake_up and the prefix-cache reset: the operations that free or drop engines' memory."""

from __future__ import annotations

from rlcp.controlplane.api.handling import NATIVE, controller_of, serve_operation
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.errors import Conflict
from rlcp.controlplane.operations import caches, sleep
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller import OperationResult, ResetPrefixCacheRequest, SleepRequest, WakeUpRequest

api = RouteTable(tag=NATIVE, context=controller_of)


async def sleep_members(ctl: Controller, body: SleepRequest) -> OperationResult:
    """The fleet's sleep, here and on the facade: refused (409) while a weight-transfer group
    is formed -- its ranks span every member, and an engine asleep cannot take a broadcast."""
    if ctl.transfer.view() is not None:
        raise Conflict(
            "a weight-transfer group spans the fleet: POST /v1/rl/weight_transfer/shutdown (or "
            "/shutdown_weight_transfer_engine) before putting members to sleep"
        )
    return await sleep.sleep(ctl, body)


serve_operation(
    api,
    "POST",
    "/v1/rl/sleep",
    "Put members to sleep (vLLM's sleep mode; with `selector` or `worker_ids`, only "
    "those): they leave the gateway's fence at once, pause (`mode`) and release memory (`level`), and are kept "
    "asleep in the desired state -- left out of other operations, put back to sleep by the reconciler -- until "
    "woken. 409 naming a member whose flavor has no sleep mode, or while a weight-transfer group is formed.",
    sleep_members,
    body=SleepRequest,
    body_optional=True,
    errors=(404,),
)
serve_operation(
    api,
    "POST",
    "/v1/rl/wake_up",
    "Wake members asleep (with `selector` or `worker_ids`, only those): each is "
    "woken, brought to the fleet's weights where it fell behind, verified (version, and its checksums against "
    "those it slept with), and only then returns inside the fence and resumes. A member that fails stays "
    "asleep, its result naming why. `tags` wakes part of the memory and leaves the members asleep.",
    sleep.wake_up,
    body=WakeUpRequest,
    body_optional=True,
    errors=(404,),
)
serve_operation(
    api,
    "POST",
    "/v1/rl/reset_prefix_cache",
    "Every member in service (with `selector`, the matching ones) drops "
    "its prefix cache; a member whose engine could not (blocks held by running requests, without "
    "`reset_running_requests`) failed. The fleet resets them itself on every weight update and adapter swap. "
    "409 naming a member whose flavor has no reset.",
    caches.reset_prefix_cache,
    body=ResetPrefixCacheRequest,
    body_optional=True,
)

"""`POST /collective_rpc` on the facade: the methods of vLLM's own weight protocol, with the
fleet meaning of the routes that run them, and a 501 naming any other method.

vLLM's engine client runs its weight protocol as engine RPCs (`AsyncLLM.init_weight_transfer_engine`
is `collective_rpc("init_weight_transfer_engine", kwargs={"init_info": ...})`, and so on in
`vllm/v1/engine/async_llm.py` and `vllm/entrypoints/rl/offline.py`), and a trainer that drives
one server through its dev route sends the same calls as `{"method", "args", "kwargs"}`; a disk
reload is `{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`. On the fleet:

| method | fleet meaning |
|---|---|
| `reload_weights` (`weights_path`) | the verified disk update, `POST /update_weights {"weight_dir"}` |
| `init_weight_transfer_engine` (`init_info`) | `POST /init_weight_transfer_engine` |
| `start_weight_update` | `POST /start_weight_update` |
| `update_weights` (`update_info`) | `POST /update_weights {"update_info"}` |
| `finish_weight_update` | `POST /finish_weight_update` |
| `shutdown_weight_transfer_engine` | `POST /shutdown_weight_transfer_engine` |

Arguments are read by name, positional ones in the method's own order, and checked before any
worker is touched (422 naming `kwargs.<name>` or `args`); `timeout` is read and left to the
controller's own deadlines. An engine RPC outside this protocol runs code the controller can
neither verify nor undo on every member: 501 naming the method and what to call instead.
The answer is vLLM's (`{"results": [...]}`, one `null` per member: these methods return
nothing), or, as on every facade route, 502/503 naming the members that failed.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from rlcp.controlplane.api.facade import FACADE_TAG, client_fields, serve_fleet_call
from rlcp.controlplane.api.handling import controller_of
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.operations import weights
from rlcp.core.errors import NotSupportedError, ValidationFailedError
from rlcp.core.http import validate
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.controller import (
    OperationResult,
    TransferFinishRequest,
    TransferInitRequest,
    TransferUpdateRequest,
    UpdateWeightsRequest,
)

api = RouteTable(tag=FACADE_TAG, context=controller_of)

# method -> its parameters, in order (the worker's signature in vllm/v1/worker/gpu_worker.py
# and gpu_model_runner.py): positional `args` are read as these.
PARAMETERS: dict[str, tuple[str, ...]] = {
    "reload_weights": ("weights_iterator", "weights_path", "is_checkpoint_format"),
    "init_weight_transfer_engine": ("init_info",),
    "start_weight_update": (),
    "update_weights": ("update_info",),
    "finish_weight_update": (),
    "shutdown_weight_transfer_engine": (),
}
_OTHERS = (
    "the controller sends no arbitrary engine RPC to the fleet: every operation it runs is one it can verify "
    f"and undo on every member. Methods with a fleet meaning: {', '.join(PARAMETERS)}; one worker's own "
    "RPCs go to that worker, or through POST /v1/rl/engine/{route} (settings engine_routes.allow)"
)
_DRAFT = "draft-model (speculative decoding) weight updates are not supported on the fleet"


class CollectiveRpcRequest(BaseModel):
    """vLLM's `POST /collective_rpc` body (`vllm/entrypoints/serve/dev/rpc/api_router.py`)."""

    model_config = ConfigDict(extra="forbid")
    method: StrictStr = Field(min_length=1, max_length=256, description="The engine method.")
    args: list[Any] = Field(
        default_factory=list, max_length=8, description="Positional arguments, in the method's own order."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments.")
    timeout: float | None = Field(
        None, gt=0, description="vLLM's RPC deadline, in seconds; the controller keeps its own deadlines."
    )


class CollectiveRpcAnswer(BaseModel):
    results: list[None] = Field(description="One null per member (these methods return nothing).")


def arguments(req: CollectiveRpcRequest) -> dict[str, Any]:
    """The call's arguments by name; a 4xx naming the one that does not fit, or a 501 for a
    method with no fleet meaning."""
    if req.method == "start_draft_weight_update":
        raise NotSupportedError(
            f"collective_rpc method {req.method!r} has no fleet meaning here: {_DRAFT}", field="method"
        )
    names = PARAMETERS.get(req.method)
    if names is None:
        raise NotSupportedError(
            f"collective_rpc method {req.method!r} has no fleet meaning here: {_OTHERS}", field="method"
        )
    if len(req.args) > len(names):
        raise ValidationFailedError(
            f"{req.method} takes {len(names)} positional argument(s) "
            f"({', '.join(names) or 'none'}), got {len(req.args)}",
            field="args",
        )
    given = dict(zip(names, req.args, strict=False))
    for name, value in req.kwargs.items():
        if name not in names:
            raise ValidationFailedError(
                f"{req.method} takes no argument {name!r} (it takes {', '.join(names) or 'none'})",
                field=f"kwargs.{name}",
            )
        if name in given:
            raise ValidationFailedError(f"{name} given both in args and kwargs", field=f"kwargs.{name}")
        given[name] = value
    return given


def _reload_request(given: dict[str, Any]) -> UpdateWeightsRequest:
    if given.get("weights_iterator") is not None:
        raise ValidationFailedError(
            "weights_iterator cannot cross HTTP: give weights_path, a directory every member reads",
            field="kwargs.weights_iterator",
        )
    if given.get("is_checkpoint_format", True) is not True:
        raise ValidationFailedError(
            "only checkpoint-format weights are loaded on the fleet (is_checkpoint_format: true)",
            field="kwargs.is_checkpoint_format",
        )
    path = given.get("weights_path")
    if not isinstance(path, str) or not path:
        raise ValidationFailedError(
            "reload_weights needs weights_path, a directory every member reads", field="kwargs.weights_path"
        )
    # The version is the directory's name, as for POST /update_weights {"weight_dir"}.
    return validate(
        UpdateWeightsRequest, {"version": PurePosixPath(path).name, "source": {"kind": "disk", "path": path}}
    )


# A native request's fields, named as the RPC's arguments in a 4xx.
_ARGUMENT_FIELDS = {
    "version": "kwargs.weights_path",
    "source.path": "kwargs.weights_path",
    "init_info": "kwargs.init_info",
    "update_info": "kwargs.update_info",
}


async def _run(ctl: Controller, method: str, given: dict[str, Any]) -> OperationResult:
    transfer = ctl.transfer
    if method == "reload_weights":
        return await weights.update_weights(ctl, _reload_request(given))
    if method == "init_weight_transfer_engine":
        return await transfer.init(validate(TransferInitRequest, {"init_info": given.get("init_info")}, strict=True))
    if method == "update_weights":
        return await transfer.update_chunk(
            validate(TransferUpdateRequest, {"update_info": given.get("update_info")}, strict=True)
        )
    if method == "start_weight_update":
        return await transfer.start()
    if method == "finish_weight_update":
        return await transfer.finish(TransferFinishRequest())
    return await transfer.shutdown()  # shutdown_weight_transfer_engine, the last of PARAMETERS


async def _collective_rpc(ctl: Controller, req: CollectiveRpcRequest) -> OperationResult:
    given = arguments(req)
    with client_fields(_ARGUMENT_FIELDS):
        return await _run(ctl, req.method, given)


serve_fleet_call(
    "POST",
    "/collective_rpc",
    "vLLM's weight protocol as engine RPCs, on the fleet: `reload_weights` "
    "(`weights_path`) is the verified disk update; `init_weight_transfer_engine`, `start_weight_update`, "
    "`update_weights`, `finish_weight_update`, `shutdown_weight_transfer_engine` are the broadcast's "
    "steps, as their routes. Any other method: 501 naming it.",
    _collective_rpc,
    lambda _, result: {"results": [None for _ in result.results]},
    body=CollectiveRpcRequest,
    ok=CollectiveRpcAnswer,
    errors=(403, 501),
    table=api,
)

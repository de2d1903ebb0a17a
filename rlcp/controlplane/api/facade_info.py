"""The facade's reads: what the fleet is, in the shapes one vLLM server answers them (`/health`,
`/weight_info`, `/get_world_size`, `/v1/models`, `/server_info`). They run no operation, so
none of them is a `fleet_call`; the routes that do are in `facade.py`.

`GET /server_info`: the fleet's configuration in vLLM's shape
(`rlcp/core/wire/server_info.py`; the merge and what it says of data parallelism in
`rlcp/controlplane/fleet/server_config.py`).

vLLM's keys are all there (`vllm_config`, as a JSON tree with `?config_format=json`, else as
vLLM's text form; `vllm_env` and `system_env`, empty: each member's are its own), and one
more, `fleet`: the members read, those that could not be (and why), each key on which they
differ with every member's value, and why `parallel_config.data_parallel_size` is what it is.
A client written for one vLLM server reads the first three and never sees a difference it
did not ask about; an operator reads `fleet`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from rlcp.controlplane.api.facade import FACADE_TAG
from rlcp.controlplane.api.handling import CONTROLLER, SESSION, controller_of
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.errors import NoMembers
from rlcp.controlplane.fleet.served import ServedModels
from rlcp.controlplane.fleet.server_config import WHY_DATA_PARALLEL, ServerConfigs, merge_configs
from rlcp.core.http import json_response, validate
from rlcp.core.openapi import RouteTable
from rlcp.core.wire.agent import WeightInfoAnswer, WorldSizeAnswer, WorldSizeQuery
from rlcp.core.wire.controller import ModelList
from rlcp.core.wire.server_info import ServerInfoAnswer, ServerInfoQuery, config_text

api = RouteTable(tag=FACADE_TAG, context=controller_of)
SERVER_CONFIGS = web.AppKey("server_configs", ServerConfigs)
SERVED_MODELS = web.AppKey("served_models", ServedModels)


class FleetConfigView(BaseModel):
    members: list[str] = Field(description="The members whose configuration was read, in id order.")
    unread: dict[str, str] = Field(description="Members whose configuration could not be read, and why.")
    differing: dict[str, dict[str, Any]] = Field(
        description="Each key (a dotted path into vllm_config) on which the members differ, with every "
        "member's own value; the common vllm_config holds null there, or the smallest for a capacity "
        "(max_loras, max_lora_rank, max_model_len, ...)."
    )
    data_parallel: str = Field(description="Why parallel_config.data_parallel_size is what it is.")


class FleetServerInfoAnswer(ServerInfoAnswer):
    fleet: FleetConfigView


@api.get(
    "/server_info",
    "The members' common configuration in vLLM's `/server_info` shape (`?config_format=json`: "
    "a JSON tree; default: vLLM's text form), keys on which they differ null (a capacity: the "
    "smallest) and listed under `fleet.differing` with each member's value; "
    "`parallel_config.data_parallel_size` is the largest of the members' own, since a load through "
    "the fleet reaches every member. 503 when no member's configuration could be read.",
    query=ServerInfoQuery,
    ok=FleetServerInfoAnswer,
    errors=(503,),
)
async def server_info(request: web.Request) -> web.Response:
    query = validate(ServerInfoQuery, dict(request.query))
    records = sorted(request.config_dict[CONTROLLER].members(), key=lambda r: r.id)
    configs, unread = await request.app[SERVER_CONFIGS].read(records)
    if not configs:
        why = "; ".join(f"{w}: {reason}" for w, reason in sorted(unread.items())) or "the fleet has no members"
        raise NoMembers(f"no member's configuration could be read ({why})")
    merged = merge_configs(configs)
    config: dict[str, Any] | str = merged.common if query.config_format == "json" else config_text(merged.common)
    return json_response(
        {
            "vllm_config": config,
            "vllm_env": {},
            "system_env": {},
            "fleet": {
                "members": sorted(configs),
                "unread": dict(sorted(unread.items())),
                "differing": merged.differing,
                "data_parallel": WHY_DATA_PARALLEL,
            },
        }
    )


@api.get("/health", "200 while some worker serves, else 503 (no body).", answers={503: None}, probe=True)
async def health(request: web.Request) -> web.Response:
    serving = any(w.serving for w in request.config_dict[CONTROLLER].state().workers)
    return web.Response(status=200 if serving else 503)


async def _weight_info(ctl: Controller, _: None) -> dict[str, object]:
    return {"weight_version": ctl.state().applied.weight_version}


async def _world_size(ctl: Controller, _: WorldSizeQuery) -> dict[str, object]:
    return {"world_size": ctl.transfer.world_size()}


api.serve(
    "GET",
    "/weight_info",
    "The fleet's common weight version (null when members disagree).",
    _weight_info,
    ok=WeightInfoAnswer,
)
api.serve(
    "GET",
    "/get_world_size",
    "Total inference ranks of the fleet.",
    _world_size,
    query=WorldSizeQuery,
    ok=WorldSizeAnswer,
)


@api.get(
    "/v1/models",
    "What the fleet serves: the union of the members' own `/v1/models` (base models and "
    "adapters), as the gateway answers it.",
    ok=ModelList,
)
async def models(request: web.Request) -> web.Response:
    ctl = request.config_dict[CONTROLLER]
    # Members with no inference URL to ask (a Dynamo worker) count with the model discovery named,
    # or the one they report.
    named = {r.id: model for r in ctl.members() if (model := r.spec.model or (r.status and r.status.model))}
    cards = await request.app[SERVED_MODELS].cards(ctl.base_state(), request.config_dict[SESSION], named=named)
    return json_response({"object": "list", "data": cards})

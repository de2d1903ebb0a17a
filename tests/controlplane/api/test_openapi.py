"""The OpenAPI documents: valid OpenAPI 3.1, generated from the wire models, served at
`GET /openapi.json` without a token, and in step with the routes each app registers."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from rlcp.agent.admin.app import build_admin_app
from rlcp.agent.admin.openapi import ROUTES as AGENT_ROUTES
from rlcp.agent.admin.openapi import agent_document
from rlcp.agent.engine.sim import SimEngine
from rlcp.agent.service import AgentService
from rlcp.agent.settings import AgentSettings
from rlcp.controlplane.api.openapi import ROUTES as CONTROLLER_ROUTES
from rlcp.controlplane.api.openapi import controller_document
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.errors import ErrorBody
from rlcp.core.openapi import MUTATING, OPENAPI_PATH, Route, build_document, built_once, route_drift
from rlcp.core.wire.agent import AgentState, DiskUpdateRequest
from rlcp.core.wire.controller import FleetState, OperationResult, UpdateWeightsRequest

pytestmark = pytest.mark.timeout(60)
REF = "#/components/schemas/{model}"


def agent_app(auth_reads: bool = False):
    settings = AgentSettings(engine={"kind": "sim", "model": "sim"}, admin={"token": "t", "auth_reads": auth_reads})
    return build_admin_app(AgentService(SimEngine(model_name="sim"), settings), token="t")


def controller_app(tmp_path: Path, auth_reads: bool = False):
    settings = ControllerSettings(
        api={"token": "t", "auth_reads": auth_reads},
        workers={"token": "w"},
        gateway={"port": 0},
        store={"kind": "memory"},
        discovery={"kind": "static", "static": []},
    )
    return assemble(settings, token="t", background=False)


DOCUMENTS = {"agent": (agent_document, AGENT_ROUTES), "controller": (controller_document, CONTROLLER_ROUTES)}


@pytest.mark.parametrize("side", DOCUMENTS)
@pytest.mark.parametrize("auth_reads", [False, True])
def test_documents_are_valid_openapi_31(side, auth_reads):
    document_for, _ = DOCUMENTS[side]
    doc = document_for(auth_reads=auth_reads)
    assert doc["openapi"] == "3.1.0"
    schemathesis.openapi.from_dict(doc).validate()  # against the OpenAPI 3.1 meta-schema
    for name, schema in doc["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)  # 3.1's dialect is JSON Schema 2020-12


@pytest.mark.parametrize("side,build", [("agent", lambda tmp: agent_app()), ("controller", controller_app)])
def test_every_registered_route_is_documented_and_every_documented_route_is_registered(side, build, tmp_path):
    _, routes = DOCUMENTS[side]
    undocumented, unregistered = route_drift(build(tmp_path), routes)
    assert undocumented == set(), f"routes without a declaration in the {side}'s openapi module"
    assert unregistered == set(), f"declared routes the {side} app does not serve"


def test_drift_is_caught_both_ways(tmp_path):
    app = agent_app()
    app.router.add_post("/v1/agent/new_thing", lambda request: None)
    fewer = [r for r in AGENT_ROUTES if r.path != "/weight_info"]
    assert route_drift(app, fewer) == ({("POST", "/v1/agent/new_thing"), ("GET", "/weight_info")}, set())
    extra = [*AGENT_ROUTES, Route("GET", "/v1/agent/ghost", "not served")]
    assert ("GET", "/v1/agent/ghost") in route_drift(agent_app(), extra)[1]


def test_schemas_come_from_the_wire_models():
    agent, ctl = agent_document(auth_reads=False), controller_document(auth_reads=False)
    for doc, models in (
        (agent, (AgentState, DiskUpdateRequest, ErrorBody)),
        (ctl, (FleetState, OperationResult, UpdateWeightsRequest, ErrorBody)),
    ):
        for model in models:
            mode = "validation" if model.__name__.endswith("Request") else "serialization"
            expected = model.model_json_schema(ref_template=REF, mode=mode)
            expected.pop("$defs", None)
            assert doc["components"]["schemas"][model.__name__] == expected, model.__name__
    body = ctl["paths"]["/v1/rl/update_weights"]["post"]["requestBody"]
    assert body == {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/UpdateWeightsRequest"}}},
    }
    # A union body: the facade's /update_weights is a broadcast chunk or a disk update.
    union = ctl["paths"]["/update_weights"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {s["$ref"].rsplit("/", 1)[1] for s in union["anyOf"]} == {"TransferUpdateRequest", "DiskWeightsRequest"}
    # Query models become query parameters, never null.
    params = {p["name"]: p for p in agent["paths"]["/pause"]["post"]["parameters"]}
    assert params["mode"]["schema"]["enum"] == ["abort", "wait", "keep"] and params["mode"]["in"] == "query"
    assert params["timeout_s"]["schema"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 3600}


def test_model_names_that_collide_get_distinct_components():
    class Thing(BaseModel):
        a: int

    other = type("Thing", (BaseModel,), {"__annotations__": {"b": str}, "__module__": "elsewhere"})
    doc = build_document(
        [Route("POST", "/a", "a", body=Thing), Route("POST", "/b", "b", body=other)],
        title="t",
        version="0",
        description="",
        auth_reads=False,
    )
    refs = {
        doc["paths"][p]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"] for p in ("/a", "/b")
    }
    assert len(refs) == 2


@pytest.mark.parametrize("side", DOCUMENTS)
def test_errors_and_security_are_declared(side):
    document_for, routes = DOCUMENTS[side]
    for auth_reads in (False, True):
        doc = document_for(auth_reads=auth_reads)
        assert set(doc["components"]["securitySchemes"]) == {"bearerAuth", "basicAuth"}
        assert doc["components"]["securitySchemes"]["basicAuth"]["scheme"] == "basic"
        for route in routes:
            op = doc["paths"][route.path][route.method.lower()]
            secured = route.method in MUTATING or (auth_reads and not route.probe)
            assert ("security" in op) == secured, (route.key, auth_reads)
            assert ("401" in op["responses"]) == secured, (route.key, auth_reads)
            if route.body is not None:
                assert {"400", "413", "422"} <= set(op["responses"]), route.key
            for status, answer in op["responses"].items():
                if int(status) >= 400 and int(status) not in route.answers:
                    assert answer["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/ErrorBody"
                    }, (route.key, status)
    error = document_for(auth_reads=False)["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message"} and "field" in error["properties"]


async def test_the_agent_serves_its_document_without_a_token():
    async with TestClient(TestServer(agent_app(auth_reads=True))) as client:
        resp = await client.get(OPENAPI_PATH)
        assert resp.status == 200 and resp.content_type == "application/json"
        assert await resp.json() == agent_document(auth_reads=True)
        assert (await client.get("/v1/agent/state")).status == 401  # reads are protected here


async def test_the_controller_serves_its_document_without_a_token(tmp_path):
    async with TestClient(TestServer(controller_app(tmp_path, auth_reads=True))) as client:
        resp = await client.get(OPENAPI_PATH)
        assert resp.status == 200 and resp.content_type == "application/json"
        assert await resp.json() == controller_document(auth_reads=True)
        assert (await client.get("/v1/rl/state")).status == 401


def test_a_document_is_built_once_per_arguments_and_each_caller_gets_its_own_copy():
    """`built_once`: every app serves its document, and tests start apps by the hundred; the
    build (pydantic's schema generation) runs once per arguments, and a copy changed by one
    caller is not what the next gets."""
    builds: list[bool] = []

    @built_once
    def document(*, auth_reads: bool) -> dict:
        builds.append(auth_reads)
        return build_document(AGENT_ROUTES, title="t", description="d", auth_reads=auth_reads)

    first = document(auth_reads=False)
    first["paths"].clear()
    again = document(auth_reads=False)
    assert again["paths"] and again == build_document(AGENT_ROUTES, title="t", description="d", auth_reads=False)
    assert document(auth_reads=True) != again
    assert builds == [False, True]

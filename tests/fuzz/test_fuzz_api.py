"""Fuzz every route of both OpenAPI documents with schemathesis, against live servers.

The controller runs over a fleet of two real agents on SimEngine (`rlcp/harness/simfleet.py`); the
agent is one real agent on SimEngine. Both are served on 127.0.0.1 from an event loop in a
background thread, because schemathesis' client is synchronous. The documents are the ones
the servers serve (tests/controlplane/api/test_openapi.py), loaded at collection: one test per operation.

Every case goes through schemathesis' checks (no 5xx; status codes, content types and bodies
as documented; input that breaks the schema rejected with a 4xx; 405 with `Allow` for a
method a path lacks; auth enforced where the document declares it) and ours:
- every 4xx carries the error shape `{"error": {"code", "message", "field"?}}`, with a
  `field` when the input was at fault (400, 401, 403, 413, 422, an unknown LoRA's 404), and
  that field names what the client sent (a body key, a query parameter) or `body`;
- a request answered with a 4xx reached no worker: the controller's fleet logs every
  mutating call a worker received (`SimAgent.touched`), the agent every engine primitive.
The only 5xx allowed are by design: a probe's 503, a weight-transfer chunk the engine
refused (`_engine_refused_chunk`), and an update whose weights do not match the fuzzed
manifest of checksums (`_manifest_refused`).

Bodies naming a directory are sometimes given a real checkpoint or adapter under the allowed
root, or a symlink out of it, and an init the fleet's world size (`flatmap_body`), so fuzzed
versions, names and modes reach the fan-out and the broadcast session too.

Deterministic: a fixed seed, derandomized generation, no example database, no shrinking.
RLCP_FUZZ_EXAMPLES (default 80 per operation, about 1.5 minutes here) and RLCP_FUZZ_SEED
widen a local bug hunt. The without-token run asserts 401 on every route the document
secures, and nothing touched.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import requests
import schemathesis
from aiohttp import web
from schemathesis.checks import not_a_server_error

from rlcp.agent.admin.openapi import ROUTES as AGENT_ROUTES
from rlcp.agent.admin.openapi import agent_document
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.api.openapi import ROUTES as CONTROLLER_ROUTES
from rlcp.controlplane.api.openapi import controller_document
from rlcp.controlplane.api.unsupported import REFUSED
from rlcp.controlplane.assembly import GATEWAY, assemble
from rlcp.controlplane.gateway import vllm_routes
from rlcp.controlplane.gateway.app import ROUTES as GATEWAY_ROUTES
from rlcp.controlplane.gateway.app import gateway_document
from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.controller import CTL_TOKEN, controller_settings
from rlcp.harness.live import LiveLoop, serve
from rlcp.harness.simfleet import TOKEN, SimAgent, start_fleet
from rlcp.harness.waiting import wait_for

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(300)]

SEED = int(os.environ.get("RLCP_FUZZ_SEED", "20260101"))
MAX_EXAMPLES = int(os.environ.get("RLCP_FUZZ_EXAMPLES", "80"))
# Statuses whose error names the input at fault.
_FIELD_STATUSES = frozenset({400, 401, 403, 413, 415, 422})
_PATH_KEYS = frozenset({"path", "weight_dir", "lora_path", "checkpoint_path", "weights_path"})
_DECLARED = {r.key: r for r in (*AGENT_ROUTES, *CONTROLLER_ROUTES)}
_GATEWAY_DECLARED = {r.key: r for r in GATEWAY_ROUTES}

# The vLLM routes with no fleet meaning, and `/collective_rpc`, whose methods outside vLLM's
# weight protocol have none.
REFUSED_ROUTES = {(method, path) for method, path, _ in REFUSED} | {("POST", "/collective_rpc")}
# The vLLM inference routes the gateway does not forward (tied to one worker, or not JSON), 501 saying why.
GATEWAY_REFUSED = {(method, path) for method, path, _ in vllm_routes.REFUSED}


# Directories under the allowed root, the same for both stacks (`roots`): a checkpoint, an
# adapter, and a symlink out of the root (which must be a 403 before any worker is called).
_REAL_DIRS: dict[str, Path] = {}


def _roots(base: Path) -> dict[str, Path]:
    root = base / "weights"
    ckpt, adapter = write_checkpoint(root / "ckpt", 1), write_adapter(root / "adapter")
    (root / "escape").symlink_to("/etc")
    paths = {"root": root, "ckpt": ckpt, "adapter": adapter, "escape": root / "escape"}
    _REAL_DIRS.update(paths)
    return paths


def _config(token: str | None) -> schemathesis.Config:
    """Bounded and deterministic, valid and invalid input. With the token: every phase but
    stateful. Without: a few examples per route, each of which must be a 401 where the
    document declares the token (and not one where it does not)."""
    data: dict[str, Any] = {
        "seed": SEED,
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES if token else 4,
            "deterministic": True,
            "database": "none",
            "no-shrink": True,
        },
        "phases": {"stateful": {"enabled": False}, "coverage": {"enabled": token is not None}},
        "checks": {
            # Valid input may still be refused: a path outside the roots (403), an adapter
            # not loaded (404), another operation running (409). Our own checks cover 4xx.
            "positive_data_acceptance": {"enabled": False},
        },
        "request-timeout": 30,
    }
    if token is not None:
        data["auth"] = {"openapi": {"bearerAuth": {"bearer": token}}}
    return schemathesis.Config.from_dict(data)


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def flatmap_body(context: Any, body: Any) -> Any:
    """Keep the body, or point its directory fields at a real checkpoint (an adapter on the LoRA
    routes) or at the link out of the root. Never the wrong kind of directory (a checkpoint as
    an adapter): only workers see inside it, so the controller answers such a request with a
    failed operation (502) by design."""
    if isinstance(body, dict) and isinstance(body.get("init_info"), dict):
        # The one init the controller accepts names the fleet's world size: trainer + 2 ranks.
        return st.one_of(st.just(body), st.just({**body, "init_info": {**body["init_info"], "world_size": 3}}))
    # Only non-empty strings are replaced: an empty one breaks the schema on purpose (a negative case).
    source = body.get("source") if isinstance(body, dict) else None
    nested = isinstance(source, dict) and _is_path(source.get("path"))
    if not _REAL_DIRS or not isinstance(body, dict) or not (nested or any(_is_path(body.get(k)) for k in _PATH_KEYS)):
        return st.just(body)
    real = _REAL_DIRS["adapter" if "lora" in context.operation.path else "ckpt"]

    def fill(d: Path) -> dict:
        out = {k: (str(d) if k in _PATH_KEYS and _is_path(v) else v) for k, v in body.items()}
        if nested:
            out["source"] = {**source, "path": str(d)}
        return out

    return st.one_of(st.just(body), st.sampled_from([real, _REAL_DIRS["escape"]]).map(fill))


def _schema(document: dict, token: str | None) -> Any:
    schema = schemathesis.openapi.from_dict(document, config=_config(token))
    schema.hook(flatmap_body)
    return schema


def _engine_refused_chunk(case: Any, response: requests.Response) -> bool:
    """A weight-transfer chunk the engine refused. Its `update_info` is backend-specific and
    opaque to both APIs (vLLM's WeightTransferUpdateRequest): only the engine can judge it,
    and its refusal fails the collective, 502 with every worker's result."""
    if response.status_code != 502 or not isinstance(case.body, dict) or "update_info" not in case.body:
        return False
    body = response.json()
    if "error" in body:  # the agent's own answer
        return body["error"]["code"] == "engine_error" and body["error"]["message"].startswith("update_weights failed")
    failed = [r for r in body.get("results", ()) if r["status"] != "ok"]
    return bool(failed) and all("update_weights failed" in (r["message"] or "") for r in failed)


def _manifest_refused(case: Any, response: requests.Response) -> bool:
    """An update whose manifest (`expected_checksums`, fuzzed) the loaded weights do not match:
    every worker fails verification against it, 502 with every worker's result."""
    if response.status_code != 502 or not isinstance(case.body, dict) or not case.body.get("expected_checksums"):
        return False
    results = response.json().get("results", ())
    return bool(results) and all(
        r["status"] == "error" and "differ from the manifest" in (r["message"] or "") for r in results
    )


def _route(case: Any) -> Any:
    """The declared route of a case; None for a method its path lacks (a 405 probe)."""
    if case.method.upper() != case.operation.method.upper():
        return None
    return _DECLARED[(case.operation.method.upper(), case.operation.path)]


def _check_error_shape(case: Any, response: requests.Response) -> None:
    """Every 4xx/5xx is the error shape, except those with a shape of their own (an operation's
    207/502 result, a probe's 503)."""
    status = response.status_code
    route = _route(case)
    if status < 400 or (route is not None and status in route.answers):
        return
    body = response.json()
    assert set(body) == {"error"}, (case.operation.label, status, body)
    error = body["error"]
    assert isinstance(error.get("code"), str) and error["code"], body
    assert isinstance(error.get("message"), str) and error["message"], body
    assert set(error) <= {"code", "message", "field"}, body
    if status in _FIELD_STATUSES or (status == 404 and "{name}" in case.operation.path):
        assert isinstance(error.get("field"), str) and error["field"], (case.operation.label, status, body)
    if status in (400, 422) and route is not None:
        # Bad input names what the client sent (or had to): a body field, a query parameter, the body.
        names = _input_names(case.operation.definition.raw, case.operation.schema.raw_schema)
        names |= set(case.body) if isinstance(case.body, dict) else set()
        names |= set(case.query or ())
        field = error["field"]
        assert field == "body" or field in names or field.split(".")[0] in names, (case.operation.label, body)


def _input_names(operation: dict, document: dict) -> set[str]:
    names = {p["name"] for p in operation.get("parameters", ())}
    stack = [s.get("schema", {}) for s in operation.get("requestBody", {}).get("content", {}).values()]
    while stack:
        schema = stack.pop()
        if "$ref" in schema:
            stack.append(document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]])
        stack += schema.get("anyOf", [])
        names |= set(schema.get("properties", {}))
    return names


# -- the controller over a SimEngine fleet ----------------------------------------------------------
@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One allowed root for both stacks, with a real checkpoint, an adapter and a symlink out."""
    return _roots(tmp_path_factory.mktemp("fuzz"))


class _FleetStack:
    """A served app over SimAgents, on a loop of its own; `close` stops both."""

    live: LiveLoop
    runner: web.AppRunner
    agents: list[SimAgent]

    def close(self) -> None:
        self.live.run(self.runner.cleanup())
        for a in self.agents:
            self.live.run(a.stop())
        self.live.close()


class ControllerStack(_FleetStack):
    def __init__(self, base: Path, paths: dict[str, Path]) -> None:
        self.live = LiveLoop()
        self.paths = paths
        self.agents: list[SimAgent] = self.live.run(start_fleet(2, [self.paths["root"]]))
        settings = controller_settings(
            base,
            [a.spec() for a in self.agents],
            allowed_roots=[str(self.paths["root"])],
            reconcile={"poll_interval_s": 0.2, "interval_s": 0.1},
            weight_transfer={"init_timeout_s": 2, "chunk_timeout_s": 2, "idle_timeout_s": 3600},
        )
        app = assemble(settings, token=CTL_TOKEN)
        self.runner, self.url = self.live.run(serve(app))
        self.live.run(self._settle(app[CONTROLLER]))

    @staticmethod
    async def _settle(ctl: Any) -> None:
        """Let the reconciler converge the fresh fleet, then stop it: a worker it called while a
        case runs would look touched by that case. The poller stays; it only reads."""
        await wait_for(
            lambda: (
                ctl.registry.membership.synced
                and all(r.reachable for r in ctl.members())
                and not any(ctl.reconciler.needs_work(r) for r in ctl.members())
            ),
            what="fleet settled",
        )
        for task in asyncio.all_tasks():
            if task.get_name() == "reconciler":
                task.cancel()

    def touched(self) -> list[int]:
        return [len(a.touched) for a in self.agents]


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory, roots: dict[str, Path]) -> Iterator[ControllerStack]:
    stack = ControllerStack(tmp_path_factory.mktemp("fuzz-controller"), roots)
    yield stack
    stack.close()


# -- one agent on SimEngine ---------------------------------------------------------------------------
class AgentStack:
    def __init__(self, paths: dict[str, Path]) -> None:
        self.live = LiveLoop()
        self.paths = paths
        self.agent: SimAgent = self.live.run(SimAgent("fuzz-agent", [self.paths["root"]]).start())
        self.url = self.agent.url
        self.engine_calls: list[str] = []
        engine, enter = self.agent.engine, self.agent.engine._enter

        async def counted(op: str, **kw: Any) -> None:
            self.engine_calls.append(op)
            await enter(op, **kw)

        engine._enter = counted  # type: ignore[method-assign]

    def touched(self) -> int:
        return len(self.engine_calls)

    def close(self) -> None:
        self.live.run(self.agent.stop())
        self.live.close()


@pytest.fixture(scope="module")
def agent(roots: dict[str, Path]) -> Iterator[AgentStack]:
    stack = AgentStack(roots)
    yield stack
    stack.close()


# -- the inference gateway over a SimEngine fleet (their OpenAI ports) ---------------------------------
class GatewayStack(_FleetStack):
    def __init__(self, base: Path, paths: dict[str, Path]) -> None:
        self.live = LiveLoop()
        self.agents: list[SimAgent] = [
            self.live.run(SimAgent(f"g{i}", [paths["root"]], serve_inference=True).start()) for i in range(2)
        ]
        settings = controller_settings(
            base,
            [a.spec() for a in self.agents],
            allowed_roots=[str(paths["root"])],
            gateway={"port": 0, "hold_timeout_s": 2},
        )
        app = assemble(settings, token=CTL_TOKEN)
        self.runner, _ = self.live.run(serve(app))
        self.gateway = app[GATEWAY]
        self.live.run(
            wait_for(
                lambda: bool(self.gateway.router.table() and len(self.gateway.router.table().routes) == 2),
                what="both workers inside the fence",
            )
        )
        assert self.gateway.url is not None
        self.url = self.gateway.url

    def routed(self) -> int:
        return sum(self.gateway.routed.values())


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, roots: dict[str, Path]) -> Iterator[GatewayStack]:
    stack = GatewayStack(tmp_path_factory.mktemp("fuzz-gateway"), roots)
    yield stack
    stack.close()


# -- the runs -------------------------------------------------------------------------------------------
# Operations that answered 2xx to a fuzzed case, per server: the run must reach the fleet.
REACHED: dict[str, set[str]] = {}
# Operations fuzzed in this process, per server: under pytest-xdist an operation's cases may run in
# another worker, whose REACHED this process cannot see.
FUZZED: dict[str, set[str]] = {}


# Headers that frame the message: a fuzzed value (`transfer-encoding: +` beside a
# Content-Length) is refused by aiohttp's HTTP parser with a plain-text 400 before any of our
# code runs; the routes are what is under test here, so the case goes without them.
_FRAMING = frozenset({"transfer-encoding", "content-length", "connection", "host", "expect", "upgrade"})


def _call(case: Any, url: str) -> Any:
    if case.headers:
        for name in [n for n in case.headers if n.lower() in _FRAMING]:
            del case.headers[name]
    return case.call(base_url=url)


def _fuzz_case(case: Any, url: str, touched: Callable[[], Any]) -> None:
    before = touched()
    FUZZED.setdefault(url, set()).add(case.operation.label)
    response = _call(case, url)
    route = _route(case)
    if 200 <= response.status_code < 300 and route is not None:
        REACHED.setdefault(url, set()).add(case.operation.label)
    # The 5xx a healthy fleet gives by design: a probe's 503 (not ready, no worker serving), a
    # weight-transfer chunk the engine refused, weights that do not match a fuzzed manifest, and
    # a vLLM route with no fleet meaning (501, saying why).
    if (
        (route is not None and route.probe and response.status_code == 503)
        or _engine_refused_chunk(case, response)
        or _manifest_refused(case, response)
        or _not_supported(case, response)
    ):
        case.validate_response(response, excluded_checks=[not_a_server_error])
    else:
        case.validate_response(response)
    _check_error_shape(case, response)
    if response.status_code == 202:
        # An update that did not wait goes on in the background: let it end, so that a later
        # case's "a 4xx touched no worker" is not judged while it still touches them.
        _wait_ended(url, response.headers["location"][0], case.headers)  # schemathesis: lower-case keys, lists
    if 400 <= response.status_code < 500 or response.status_code == 501:
        assert touched() == before, f"{case.operation.label} answered {response.status_code} but reached a worker"


def _not_supported(case: Any, response: Any) -> bool:
    return response.status_code == 501 and (case.method.upper(), case.path) in REFUSED_ROUTES


def _wait_ended(url: str, location: str, headers: dict[str, str] | None, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = requests.get(url + location, headers=headers, timeout=10)
        assert answer.status_code == 200, answer.text
        if answer.json()["status"] != "running":
            return
        assert time.monotonic() < deadline, f"{location} still running after {timeout_s:g}s"
        time.sleep(0.02)


def _no_token_case(case: Any, url: str, touched: Callable[[], Any]) -> None:
    before = touched()
    response = _call(case, url)
    _check_error_shape(case, response)
    if bool(case.operation.definition.raw.get("security")):
        assert response.status_code == 401, (case.operation.label, response.status_code, response.text)
        assert response.json()["error"]["code"] == "unauthorized"
        assert touched() == before
    else:
        assert response.status_code != 401, case.operation.label


# The documents the servers serve (test_openapi.py checks they are the same), loaded at
# collection so that each operation is its own test; each call names its server.
controller_api = _schema(controller_document(auth_reads=False), CTL_TOKEN)
controller_api_no_token = _schema(controller_document(auth_reads=False), None)
agent_api = _schema(agent_document(auth_reads=False), TOKEN)
agent_api_no_token = _schema(agent_document(auth_reads=False), None)


gateway_api = _schema(gateway_document(secured=False), None)


@gateway_api.parametrize()
def test_fuzz_gateway(case, gateway):
    """The gateway's own answers hold to its document and refuse bad input before any worker; what a
    worker answered (it says so in `X-RL-Worker`) is the worker's to shape, and must not be a 5xx."""
    before = gateway.routed()
    response = _call(case, gateway.url)
    if any(name.lower() == "x-rl-worker" for name in response.headers):
        assert response.status_code < 500, (case.operation.label, response.status_code, response.text[:300])
        return
    route = _GATEWAY_DECLARED.get((case.operation.method.upper(), case.operation.path))
    refused = response.status_code == 501 and (case.operation.method.upper(), case.operation.path) in GATEWAY_REFUSED
    if (route is not None and route.probe and response.status_code == 503) or refused:
        case.validate_response(response, excluded_checks=[not_a_server_error])
    else:
        case.validate_response(response)
    if response.status_code >= 400 and not (route is not None and response.status_code in route.answers):
        error = response.json()["error"]
        assert error["code"] and error["message"], response.text
        if response.status_code in _FIELD_STATUSES:
            assert error.get("field"), (case.operation.label, response.text)
    if 400 <= response.status_code < 500:
        assert gateway.routed() == before, (
            case.operation.label,
            response.status_code,
            dict(response.headers),
            response.text[:300],
            case.body,
            case.headers,
        )


@controller_api.parametrize()
def test_fuzz_controller(case, controller):
    _fuzz_case(case, controller.url, controller.touched)


@agent_api.parametrize()
def test_fuzz_agent(case, agent):
    _fuzz_case(case, agent.url, agent.touched)


@controller_api_no_token.parametrize()
def test_fuzz_controller_without_token(case, controller):
    _no_token_case(case, controller.url, controller.touched)


@agent_api_no_token.parametrize()
def test_fuzz_agent_without_token(case, agent):
    _no_token_case(case, agent.url, agent.touched)


# One closing check per server, each judging the cases of its server fuzzed in its own process: the
# full run (scripts/test.sh) runs the controller's cases with their check in one process and the rest
# in another, side by side. Not under pytest-xdist: schemathesis' items then share one node id per
# test function (`--dist loadgroup` or `loadscope` would run one operation of each and drop the rest).
def test_the_controller_fuzzing_reached_past_validation(controller):
    """Real operations ran, broadcast included: the cases are not all rejected at the door."""
    if controller.url not in FUZZED:
        pytest.skip("the controller's fuzz cases did not run in this process")
    # Of these, the ones fuzzed in this process (all of them without xdist).
    assert {
        "POST /v1/rl/update_weights",
        "POST /v1/rl/loras",
        "POST /v1/rl/pause",
        "POST /v1/rl/weight_transfer/init",
        "POST /v1/rl/weight_transfer/update",
        "POST /update_weights",
        "POST /load_lora_adapter",
    } & FUZZED[controller.url] <= REACHED.get(controller.url, set())


def test_the_agent_fuzzing_reached_past_validation(agent):
    """The same for the agent's routes."""
    if agent.url not in FUZZED:
        pytest.skip("the agent's fuzz cases did not run in this process")
    assert {
        "POST /v1/agent/weights/disk",
        "POST /v1/agent/loras",
        "POST /init_weight_transfer_engine",
        "POST /update_weights",
        "PUT /v1/agent/desired",
    } & FUZZED[agent.url] <= REACHED.get(agent.url, set())


# -- what the fuzzing found, pinned -------------------------------------------------------------------------
async def test_fuzz_findings_stay_fixed(tmp_path):
    from rlcp.harness.controller import start_controller

    agents = await start_fleet(1, [tmp_path])
    ctl = await start_controller(tmp_path, agents)
    agent, auth = agents[0], {"Authorization": f"Bearer {TOKEN}"}
    http = ctl.client.session
    try:
        # 405 names the allowed methods (RFC 9110), token or not; an unknown route is a 404, not a 401.
        for base in (str(ctl.client.make_url("")).rstrip("/"), agent.url):
            async with http.put(base + "/healthz") as resp:
                assert resp.status == 405 and "GET" in resp.headers["Allow"]
            async with http.post(base + "/nope") as resp:
                assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
        # JSON bodies are typed: no quiet coercion of "no" to False or true to 1.0 s.
        for body, field in (
            ({"version": "v", "source": {"path": str(tmp_path)}, "verify": "no"}, "verify"),
            ({"version": "v", "source": {"path": str(tmp_path)}, "timeout_s": True}, "timeout_s"),
        ):
            status, resp = await ctl.call("POST", "/v1/rl/update_weights", body)
            assert (status, resp["error"]["field"]) == (422, field)
        assert (await ctl.call("POST", "/pause?mode=keep&timeout_s=5"))[0] == 200  # a query stays text
        # The facade's errors name the facade's fields.
        status, resp = await ctl.call("POST", "/load_lora_adapter", {"lora_name": "a b", "lora_path": str(tmp_path)})
        assert (status, resp["error"]["field"]) == (422, "lora_name") and resp["error"]["message"].startswith(
            "lora_name"
        )
        for body, field in (
            ({"weight_dir": "/"}, "weight_dir"),
            ({"weight_dir": str(tmp_path), "weight_version": ""}, "weight_version"),
        ):
            status, resp = await ctl.call("POST", "/update_weights", body)
            assert (status, resp["error"]["field"]) == (422, field), resp
        # The agent refuses weight-transfer calls out of order with a 409, before the engine.
        chunks = agent.engine.weight_update_chunks
        for path in ("/start_weight_update", "/finish_weight_update"):
            async with http.post(agent.url + path, headers=auth) as resp:
                assert resp.status == 409, path
        async with http.post(agent.url + "/update_weights", json={"update_info": {}}, headers=auth) as resp:
            assert resp.status == 409
        for path in ("/init_weight_transfer_engine", "/start_weight_update"):
            async with http.post(
                agent.url + path, json={"init_info": {}} if "init" in path else None, headers=auth
            ) as resp:
                assert resp.status == 200, path
        async with http.post(agent.url + "/start_weight_update", headers=auth) as resp:
            assert resp.status == 409 and "already open" in (await resp.json())["error"]["message"]
        # A chunk the engine cannot read is its refusal (502), not a crash (500); the update is over.
        async with http.post(agent.url + "/update_weights", json={"update_info": {"names": 7}}, headers=auth) as resp:
            assert resp.status == 502 and (await resp.json())["error"]["code"] == "engine_error"
        async with http.post(agent.url + "/finish_weight_update", headers=auth) as resp:
            assert resp.status == 409
        assert agent.engine.weight_update_chunks == chunks
    finally:
        await ctl.client.close()
        await agent.stop()

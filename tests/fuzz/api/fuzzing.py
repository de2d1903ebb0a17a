"""What every schemathesis case goes through, whichever server it is for: the schemas, the hook
that gives bodies real directories, the call, and the checks on the answer.

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
RLCP_FUZZ_EXAMPLES (default 40 generated cases per operation, beside the coverage phase's
boundary cases: ~5,800 cases over the servers, ~145 CPU-s here; 80 made ~8,700 in ~250) and RLCP_FUZZ_SEED
widen a local bug hunt. The without-token run asserts 401 on every route the document
secures, and nothing touched.

Every case is counted for its server (`reach.record`), and those that answered a 2xx too: the
closing checks (tests/fuzz/api/reach.py) judge over them at the end of the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import requests
import schemathesis
from schemathesis.checks import not_a_server_error

from rlcp.agent.admin.openapi import ROUTES as AGENT_ROUTES
from rlcp.controlplane.api.openapi import ROUTES as CONTROLLER_ROUTES
from rlcp.controlplane.api.unsupported import REFUSED
from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from tests.fuzz.api import reach

SEED = int(os.environ.get("RLCP_FUZZ_SEED", "20260101"))
MAX_EXAMPLES = int(os.environ.get("RLCP_FUZZ_EXAMPLES", "40"))
# Statuses whose error names the input at fault.
FIELD_STATUSES = frozenset({400, 401, 403, 413, 415, 422})
_PATH_KEYS = frozenset({"path", "weight_dir", "lora_path", "checkpoint_path", "weights_path"})
_DECLARED = {r.key: r for r in (*AGENT_ROUTES, *CONTROLLER_ROUTES)}

# The vLLM routes with no fleet meaning, and `/collective_rpc`, whose methods outside vLLM's
# weight protocol have none.
REFUSED_ROUTES = {(method, path) for method, path, _ in REFUSED} | {("POST", "/collective_rpc")}


# Directories under the allowed root, the same for every server (the `roots` fixture makes them): a
# checkpoint, an adapter, and a symlink out of the root (which must be a 403 before any worker is called).
_REAL_DIRS: dict[str, Path] = {}


def make_roots(base: Path) -> dict[str, Path]:
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


def schema(document: dict, token: str | None) -> Any:
    """A served document, loaded at collection so that each operation is its own test."""
    loaded = schemathesis.openapi.from_dict(document, config=_config(token))
    loaded.hook(flatmap_body)
    return loaded


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


def check_error_shape(case: Any, response: requests.Response) -> None:
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
    if status in FIELD_STATUSES or (status == 404 and "{name}" in case.operation.path):
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


# Headers that frame the message: a fuzzed value (`transfer-encoding: +` beside a
# Content-Length) is refused by aiohttp's HTTP parser with a plain-text 400 before any of our
# code runs; the routes are what is under test here, so the case goes without them.
_FRAMING = frozenset({"transfer-encoding", "content-length", "connection", "host", "expect", "upgrade"})


def call(case: Any, url: str) -> Any:
    if case.headers:
        for name in [n for n in case.headers if n.lower() in _FRAMING]:
            del case.headers[name]
    return case.call(base_url=url)


def fuzz_case(server: str, case: Any, url: str, touched: Callable[[], Any]) -> None:
    """One case with the token: the checks above, and what it reached recorded for the closing checks."""
    before = touched()
    response = call(case, url)
    route = _route(case)
    reach.record(server, case.operation.label, reached=200 <= response.status_code < 300 and route is not None)
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
    check_error_shape(case, response)
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


def no_token_case(server: str, case: Any, url: str, touched: Callable[[], Any]) -> None:
    """One case without the token: a 401 where the document declares the token, and nothing touched."""
    before = touched()
    response = call(case, url)
    reach.record(f"{server} without token", case.operation.label, reached=200 <= response.status_code < 300)
    check_error_shape(case, response)
    if bool(case.operation.definition.raw.get("security")):
        assert response.status_code == 401, (case.operation.label, response.status_code, response.text)
        assert response.json()["error"]["code"] == "unauthorized"
        assert touched() == before
    else:
        assert response.status_code != 401, case.operation.label

"""Fuzz every operation of the inference gateway's OpenAPI document with schemathesis, against the
gateway over two SimEngine agents' OpenAI ports (conftest.py): its own answers hold to its document,
and input it refuses reaches no worker. The document is the one the gateway serves, loaded at
collection: one test per operation.
"""

from __future__ import annotations

import pytest
from schemathesis.checks import not_a_server_error

from rlcp.controlplane.gateway import vllm_routes
from rlcp.controlplane.gateway.app import ROUTES as GATEWAY_ROUTES
from rlcp.controlplane.gateway.app import gateway_document
from tests.fuzz.api import reach
from tests.fuzz.api.fuzzing import FIELD_STATUSES, call, schema

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(300)]

GATEWAY_DECLARED = {r.key: r for r in GATEWAY_ROUTES}
# The vLLM inference routes the gateway does not forward (tied to one worker, or not JSON), 501 saying why.
GATEWAY_REFUSED = {(method, path) for method, path, _ in vllm_routes.REFUSED}

gateway_api = schema(gateway_document(secured=False), None)


@gateway_api.parametrize()
def test_fuzz_gateway(case, gateway):
    """The gateway's own answers hold to its document and refuse bad input before any worker; what a
    worker answered (it says so in `X-RL-Worker`) is the worker's to shape, and must not be a 5xx."""
    before = gateway.routed()
    response = call(case, gateway.url)
    reach.record("gateway", case.operation.label, reached=200 <= response.status_code < 300)
    if any(name.lower() == "x-rl-worker" for name in response.headers):
        assert response.status_code < 500, (case.operation.label, response.status_code, response.text[:300])
        return
    route = GATEWAY_DECLARED.get((case.operation.method.upper(), case.operation.path))
    refused = response.status_code == 501 and (case.operation.method.upper(), case.operation.path) in GATEWAY_REFUSED
    if (route is not None and route.probe and response.status_code == 503) or refused:
        case.validate_response(response, excluded_checks=[not_a_server_error])
    else:
        case.validate_response(response)
    if response.status_code >= 400 and not (route is not None and response.status_code in route.answers):
        error = response.json()["error"]
        assert error["code"] and error["message"], response.text
        if response.status_code in FIELD_STATUSES:
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

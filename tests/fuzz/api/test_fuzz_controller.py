"""Fuzz every operation of the controller's OpenAPI document (the admin API and the vLLM facade) with
schemathesis, with its token, against the controller over two SimEngine agents (conftest.py). What
each case is checked for: fuzzing.py. The document is the one the controller serves
(tests/controlplane/api/test_openapi.py), loaded at collection: one test per operation.
"""

from __future__ import annotations

import pytest

from rlcp.controlplane.api.openapi import controller_document
from rlcp.harness.controller import CTL_TOKEN
from tests.fuzz.api import reach
from tests.fuzz.api.fuzzing import fuzz_case, schema

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(300)]

controller_api = schema(controller_document(auth_reads=False), CTL_TOKEN)

# The closing check, `test_the_controller_fuzzing_reached_past_validation` (reach.py): real operations
# ran, broadcast included, not every case rejected at the door. By the end of the run, each of these
# that was fuzzed answered a 2xx at least once, counted over every process that ran the controller's cases.
reach.require(
    "controller",
    __file__,
    {
        "POST /v1/rl/update_weights",
        "POST /v1/rl/loras",
        "POST /v1/rl/pause",
        "POST /v1/rl/weight_transfer/init",
        "POST /v1/rl/weight_transfer/update",
        "POST /update_weights",
        "POST /load_lora_adapter",
    },
)


@controller_api.parametrize()
def test_fuzz_controller(case, controller):
    fuzz_case("controller", case, controller.url, controller.touched)

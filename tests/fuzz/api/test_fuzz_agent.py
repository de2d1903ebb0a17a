"""Fuzz every operation of the agent's OpenAPI document with schemathesis, with its token, against one
agent on SimEngine (conftest.py). What each case is checked for: fuzzing.py. The document is the one
the agent serves (tests/controlplane/api/test_openapi.py), loaded at collection: one test per operation.
"""

from __future__ import annotations

import pytest

from rlcp.agent.admin.openapi import agent_document
from rlcp.harness.simfleet import TOKEN
from tests.fuzz.api import reach
from tests.fuzz.api.fuzzing import fuzz_case, schema

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(300)]

agent_api = schema(agent_document(auth_reads=False), TOKEN)

# The closing check, `test_the_agent_fuzzing_reached_past_validation` (reach.py): the same as the
# controller's, for the agent's routes.
reach.require(
    "agent",
    __file__,
    {
        "POST /v1/agent/weights/disk",
        "POST /v1/agent/loras",
        "POST /init_weight_transfer_engine",
        "POST /update_weights",
        "PUT /v1/agent/desired",
    },
)


@agent_api.parametrize()
def test_fuzz_agent(case, agent):
    fuzz_case("agent", case, agent.url, agent.touched)

"""Fuzz the controller's and the agent's documents without their token: a few cases per operation
(fuzzing.py), each a 401 where the document declares the token (and not one where it does not),
with nothing touched.
"""

from __future__ import annotations

import pytest

from rlcp.agent.admin.openapi import agent_document
from rlcp.controlplane.api.openapi import controller_document
from tests.fuzz.api.fuzzing import no_token_case, schema

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(300)]

controller_api_no_token = schema(controller_document(auth_reads=False), None)
agent_api_no_token = schema(agent_document(auth_reads=False), None)


@controller_api_no_token.parametrize()
def test_fuzz_controller_without_token(case, controller):
    no_token_case("controller", case, controller.url, controller.touched)


@agent_api_no_token.parametrize()
def test_fuzz_agent_without_token(case, agent):
    no_token_case("agent", case, agent.url, agent.touched)

"""The session's real vLLM agents, shared across modules (tests/conftest.py), put back into a
known state by the test that needs one, so that no test assumes which ran before it."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from rlcp.harness.http import call
from rlcp.harness.processes import AgentProcess


async def put_back(http: aiohttp.ClientSession, agent: AgentProcess, weights: Path, version: str) -> AgentProcess:
    """`agent` resumed, serving `weights` as `version`, with no desired version (so it is ready
    under any controller that sets none)."""
    await call(http, "POST", agent.admin_url + "/resume", headers=agent.auth)
    status, body = await call(
        http,
        "POST",
        agent.admin_url + "/v1/agent/weights/disk",
        headers=agent.auth,
        body={"path": str(weights), "version": version},
    )
    assert status == 200, body
    status, body = await call(
        http, "PUT", agent.admin_url + "/v1/agent/desired", headers=agent.auth, body={"weight_version": None}
    )
    assert status == 200, body
    return agent

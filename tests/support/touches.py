"""Whether a refused request reached a worker, judged by what carried its own request id.

The controller passes a request's `X-Request-ID` on to every worker call it makes for it, and
`SimAgent.touched_by(rid)` lists the mutating calls that carried `rid`. Comparing an agent's
whole `touched` list before and after a refused request also counts what the reconciler did
meanwhile: under load it re-sends a worker its desired state (after a status read timed out
while the test's loop was stalled), which is not the refused request's doing.

    rid = fresh_request_id("bad-version")
    status, body = await ctl.call("POST", path, payload, headers=with_request_id(rid))
    assert_no_worker_touched(agents, rid, path)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from rlcp.core import tracing
from rlcp.harness.controller import AUTH
from rlcp.harness.simfleet import SimAgent


def fresh_request_id(label: str = "refused") -> str:
    """A request id of its own for one call, one the controller keeps: an id it would not
    accept (a space, too long) is replaced by one it mints, and the check could never fail."""
    rid = f"{label}-{uuid.uuid4().hex}"
    kept = tracing.from_headers({tracing.REQUEST_ID_HEADER: rid}).request_id
    assert kept == rid, f"not a usable X-Request-ID: {rid!r}"
    return rid


def with_request_id(rid: str, headers: Mapping[str, str] | None = AUTH) -> dict[str, str]:
    """`headers` (the controller's token by default) and `rid` as the call's X-Request-ID."""
    return {**(headers or {}), tracing.REQUEST_ID_HEADER: rid}


def assert_no_worker_touched(agents: Iterable[SimAgent], rid: str, what: object = "") -> None:
    """No mutating call carrying `rid` reached any of `agents`."""
    touched = {a.agent_id: calls for a in agents if (calls := a.touched_by(rid))}
    assert touched == {}, f"a refused request reached a worker: {what} {touched}"

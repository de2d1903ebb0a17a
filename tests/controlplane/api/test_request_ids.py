"""Request ids travel (`rlcp.core.tracing`): a trainer's `X-Request-ID` and `traceparent` reach
every worker call its update causes and every log line of it, through a real controller
daemon (its front and its core) to real agents on SimEngine; the answer echoes the id; a
call that brings none gets one made for it, carried the same way."""

from __future__ import annotations

import json
import re

import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import AUTH, update_body
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
# A verified disk update at the floor of its round trips (issue 35): the checkpoint checked before
# anyone pauses, then one call that does the rest and answers the state.
UPDATE_CALLS = ["POST /v1/agent/weights/check", "POST /v1/agent/weights/update"]


def core_log_lines(ctl: ControllerProcess) -> list[dict]:
    lines = []
    for text in ctl.log_path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue
    return lines


async def test_a_trainers_ids_reach_every_worker_call_and_log_line_of_its_update(daemon_fleet, tmp_path, capfd):
    agents, ctl, http = daemon_fleet
    for a in agents:
        a.traced.clear()
    headers = {**AUTH, "X-Request-ID": "trainer-step-7", "traceparent": f"00-{TRACE}-{CALLER_SPAN}-01"}
    async with http.post(
        ctl.url + "/v1/rl/update_weights", headers=headers, json=update_body("v1", write_checkpoint(tmp_path / "v1", 1))
    ) as resp:
        result = await resp.json()
        assert resp.status == 200, result
        assert resp.headers["X-Request-ID"] == "trainer-step-7"
    spans = set()
    for a in agents:
        # Every request the update caused carries its id: counted as each agent saw them, these
        # are all of them (the status poll's reads carry none of it).
        assert [c for c, rid, _ in a.traced if rid == "trainer-step-7"] == UPDATE_CALLS, (a.agent_id, a.traced)
        calls = [(c, rid, tp) for c, rid, tp in a.traced if c in UPDATE_CALLS]
        assert [c for c, _, _ in calls] == UPDATE_CALLS, (a.agent_id, a.traced)
        for call, rid, tp in calls:
            assert rid == "trainer-step-7", (a.agent_id, call, rid)
            match = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01", tp or "")
            assert match and match.group(1) == TRACE, (a.agent_id, call, tp)
            spans.add(match.group(2))
    assert len(spans) == 2 * len(UPDATE_CALLS) and CALLER_SPAN not in spans  # a new span per worker call
    # The controller's own summary line of the update carries them (its JSON log).
    ops = [
        line
        for line in core_log_lines(ctl)
        if line.get("event") == "operation" and line.get("operation") == "update_weights"
    ]
    assert ops and all(op.get("request_id") == "trainer-step-7" and op.get("trace_id") == TRACE for op in ops), ops
    # ...and so do the agents' (in this process: structlog's console lines).
    out = capfd.readouterr()
    agent_lines = [line for line in (out.out + out.err).splitlines() if "route=/v1/agent/weights/update" in line]
    assert len(agent_lines) >= 2, agent_lines
    assert all("request_id=trainer-step-7" in line and f"trace_id={TRACE}" in line for line in agent_lines)


async def test_a_call_without_ids_gets_one_carried_the_same_way_and_a_bad_one_is_replaced(daemon_fleet, tmp_path):
    agents, ctl, http = daemon_fleet
    made_ids = set()
    for given in (None, "has space", "x" * 500):
        for a in agents:
            a.traced.clear()
        headers = {**AUTH} if given is None else {**AUTH, "X-Request-ID": given}
        async with http.post(ctl.url + "/v1/rl/pause", headers=headers, json={"mode": "keep"}) as resp:
            assert resp.status == 200, await resp.text()
            made = resp.headers["X-Request-ID"]
        assert made != given and re.fullmatch(r"[0-9a-f]{12}", made), made
        made_ids.add(made)
        seen = [(c, rid, tp) for a in agents for c, rid, tp in a.traced if c == "POST /pause"]
        assert len(seen) == 2 and {rid for _, rid, _ in seen} == {made}, seen
        assert len({tp.split("-")[1] for _, _, tp in seen}) == 1  # one trace, made for the call

    # Status reads carry the id of the call that caused them (a pause's final read), and the
    # background poller's, which no call caused, carry none.
    def polls() -> set[str | None]:
        return {rid for a in agents for c, rid, _ in a.traced if c == "GET /v1/agent/state"}

    await wait_for(lambda: None in polls(), what="a poll of the background poller")
    assert polls() - {None} <= made_ids, polls()

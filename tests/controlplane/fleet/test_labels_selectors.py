"""Labels and selectors over a sim fleet (real agent code on SimEngine, on loopback): members
carry their static config's labels into /v1/rl/state and /v1/rl/workers; `selector` narrows
both reads; a selector-scoped pause touches only the matching members and holds them paused
(the reconciler keeps them so, the others keep serving, a weight update leaves them paused);
a selector-scoped resume releases them; bad or empty selectors are 422 naming `selector`
before any worker is touched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import rlctl, start_controller, update_body
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support.fleets import ROLES, Labelled

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def fleet(tmp_path: Path) -> Any:
    agents = [await SimAgent(wid, [tmp_path]).start() for wid in ROLES]
    ctl = await start_controller(tmp_path, [Labelled(a, ROLES[a.agent_id]) for a in agents])
    await ctl.wait_settled()  # the reconciler's first PUT to each agent is not a test's touch
    yield ctl, {a.agent_id: a for a in agents}
    await ctl.client.close()
    for a in agents:
        await a.stop()


def ids(workers: list[dict[str, Any]], key: str = "id") -> list[str]:
    return sorted(w[key] for w in workers)


async def test_reads_show_labels_and_filter_by_selector(fleet: Any) -> None:
    ctl, _ = fleet
    st = await ctl.state()
    assert {w["id"]: w["labels"] for w in st["workers"]} == ROLES
    status, listing = await ctl.call("GET", "/v1/rl/workers", headers={})
    assert status == 200 and {w["instance_id"]: w["labels"] for w in listing["workers"]} == ROLES

    for selector, expected in [
        ("role=policy", ["w0", "w1"]),
        ("role==policy,zone!=b", ["w0"]),
        ("zone in (a, c)", ["w0", "w2"]),
        ("role notin (policy)", ["w2"]),
        ("zone", ["w0", "w1", "w2"]),
        ("!zone", []),
        ("role=teacher", []),
    ]:
        status, st = await ctl.call("GET", f"/v1/rl/state?selector={selector}", headers={})
        assert status == 200 and ids(st["workers"]) == expected, selector
        status, listing = await ctl.call("GET", f"/v1/rl/workers?selector={selector}", headers={})
        assert status == 200 and ids(listing["workers"], "instance_id") == expected, selector

    for path in ("/v1/rl/state", "/v1/rl/workers"):
        status, body = await ctl.call("GET", f"{path}?selector=role in policy", headers={})
        assert status == 422, body
        assert body["error"]["field"] == "selector" and "role in" in body["error"]["message"]


async def test_selector_pause_holds_only_the_matching_members(fleet: Any, tmp_path: Path) -> None:
    ctl, agents = fleet
    before = {wid: len(a.touched) for wid, a in agents.items()}
    status, result = await ctl.call("POST", "/v1/rl/pause", {"mode": "keep", "selector": "role=reference"})
    assert status == 200, result
    assert [r["worker_id"] for r in result["results"]] == ["w2"]
    assert result["detail"] == {"mode": "keep", "selector": "role=reference", "workers": ["w2"]}
    assert agents["w2"].service.paused and not agents["w0"].service.paused and not agents["w1"].service.paused
    assert {wid: len(a.touched) for wid, a in agents.items() if wid != "w2"} == {"w0": before["w0"], "w1": before["w1"]}
    st = await ctl.state()
    assert st["desired"]["paused"] is False and st["desired"]["held"] == {"w2": "keep"}
    assert {w["id"]: (w["held"], w["serving"]) for w in st["workers"]} == {
        "w0": (False, True),
        "w1": (False, True),
        "w2": (True, False),
    }
    assert st["pause_state"] == "mixed"

    # The reconciler keeps the hold: an agent resumed behind the controller's back is paused again,
    # and it never pauses the others.
    await agents["w2"].service.control.resume()
    assert not agents["w2"].service.paused
    await wait_for(lambda: agents["w2"].service.paused, what="w2 paused again by the reconciler")
    assert not agents["w0"].service.paused and not agents["w1"].service.paused

    # A weight update updates the held member and leaves it paused; the rest resume.
    write_checkpoint(tmp_path / "ck" / "v1", 1)
    status, result = await ctl.call("POST", "/v1/rl/update_weights", update_body("v1", tmp_path / "ck" / "v1"))
    assert status == 200, result
    assert all(a.service.weight_version == "v1" for a in agents.values())
    assert agents["w2"].service.paused and not agents["w0"].service.paused and not agents["w1"].service.paused

    # Resume by selector releases the hold and resumes only it.
    status, result = await ctl.call("POST", "/v1/rl/resume", {"selector": "zone=a,role=reference"})
    assert status == 200, result
    assert [r["worker_id"] for r in result["results"]] == ["w2"]
    assert not agents["w2"].service.paused
    assert (await ctl.state())["desired"]["held"] == {}


async def test_fleet_wide_resume_releases_holds_and_selector_resume_of_a_paused_fleet_is_refused(fleet: Any) -> None:
    ctl, agents = fleet
    status, _ = await ctl.call("POST", "/v1/rl/pause", {"selector": "role=policy"})
    assert status == 200
    status, _ = await ctl.call("POST", "/v1/rl/pause", {})
    assert status == 200 and all(a.service.paused for a in agents.values())
    st = await ctl.state()
    assert st["desired"]["paused"] is True and st["desired"]["held"] == {}

    touched = {wid: len(a.touched) for wid, a in agents.items()}
    status, body = await ctl.call("POST", "/v1/rl/resume", {"selector": "role=policy"})
    assert status == 409 and "whole fleet is paused" in body["error"]["message"]
    assert {wid: len(a.touched) for wid, a in agents.items()} == touched

    status, _ = await ctl.call("POST", "/v1/rl/pause", {"selector": "zone=b"})
    assert status == 200
    status, result = await ctl.call("POST", "/v1/rl/resume", {})
    assert status == 200 and len(result["results"]) == 3
    assert not any(a.service.paused for a in agents.values())
    assert (await ctl.state())["desired"]["held"] == {}


@pytest.mark.parametrize(
    "selector,why",
    [
        ("role=teacher", "matches none of the 3 members"),
        ("role in (policy", "missing ')'"),
        ("bad key=x", "after 'bad'"),
        ("role=policy,", "ends with ','"),
    ],
)
async def test_bad_or_empty_selectors_touch_nothing(fleet: Any, selector: str, why: str) -> None:
    ctl, agents = fleet
    touched = {wid: len(a.touched) for wid, a in agents.items()}
    status, ops_before = await ctl.call("GET", "/v1/rl/operations", headers={})
    for path in ("/v1/rl/pause", "/v1/rl/resume"):
        status, body = await ctl.call("POST", path, {"selector": selector})
        assert status == 422, body
        assert body["error"]["field"] == "selector" and why in body["error"]["message"], body
    assert {wid: len(a.touched) for wid, a in agents.items()} == touched
    status, ops = await ctl.call("GET", "/v1/rl/operations", headers={})
    assert ops == ops_before
    st = await ctl.state()
    assert st["desired"]["held"] == {} and st["desired"]["paused"] is False


async def test_rlctl_shows_labels_and_takes_a_selector(fleet: Any) -> None:
    ctl, agents = fleet
    rc, out, err = await rlctl(ctl.url, "state")
    assert rc == 0, err
    assert "w2: labels role=reference,zone=a" in out
    rc, out, err = await rlctl(ctl.url, "-o", "json", "state", "-l", "zone=a")
    assert rc == 0, err
    assert ids(json.loads(out)["workers"]) == ["w0", "w2"]
    rc, out, err = await rlctl(ctl.url, "workers", "--selector", "role in (reference)")
    assert rc == 0, err
    assert "w2" in out and "w0" not in out and "role=reference,zone=a" in out

    rc, out, err = await rlctl(ctl.url, "pause", "-l", "role=reference")
    assert rc == 0, err
    assert agents["w2"].service.paused and not agents["w0"].service.paused
    rc, out, err = await rlctl(ctl.url, "state")
    assert rc == 0 and "held" in out
    rc, out, err = await rlctl(ctl.url, "resume", "-l", "role=reference")
    assert rc == 0, err
    assert not agents["w2"].service.paused

    rc, out, err = await rlctl(ctl.url, "pause", "-l", "role in (")
    assert rc == 2 and "selector" in err and not any(a.service.paused for a in agents.values())

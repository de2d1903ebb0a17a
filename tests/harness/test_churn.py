"""The churn plan (`rlcp.harness.churn`): parsed and checked as data, and applied to a listing the
controller's own `http_listing` parser reads, with stand-in agents (no process, no engine)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from rlcp.controlplane.discovery.http_listing import parse_listing
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.churn import Churn, ChurnEvent, ListedMembers, ListingServer, check_churn, parse_churn
from rlcp.harness.processes import AgentProcess
from rlcp.localfleet.options import parse_args

pytestmark = pytest.mark.timeout(30)


def test_a_plan_is_parsed_in_step_order_and_bad_items_are_named() -> None:
    assert parse_churn("8:kill=agent-0, 5:join,10:leave") == [
        ChurnEvent(5, "join"),
        ChurnEvent(8, "kill", "agent-0"),
        ChurnEvent(10, "leave"),
    ]
    for bad, why in [
        ("5", "expected STEP:ACTION"),
        ("0:join", "expected STEP:ACTION"),
        ("x:join", "expected STEP:ACTION"),
        ("5:grow", "unknown action 'grow' (known: join, leave, kill, crash)"),
        ("5:join=agent-9", "a join starts a new agent"),
        ("", "no events"),
    ]:
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_churn(bad)


def test_a_plan_is_checked_against_the_fleet_and_the_run() -> None:
    two = ["agent-0", "agent-1"]
    assert check_churn(parse_churn("5:join,8:kill=agent-0,10:leave"), two, 16) == ["agent-0", "agent-1"]
    assert check_churn(parse_churn("5:join,10:leave=agent-0"), two, 16) == ["agent-1", "agent-2"]
    with pytest.raises(ValueError, match="a change after step 15 lands in none"):
        check_churn(parse_churn("16:join"), two, 16)
    with pytest.raises(ValueError, match="no member 'agent-7' then"):
        check_churn(parse_churn("3:kill=agent-7"), two, 16)
    with pytest.raises(ValueError, match="no member 'agent-1' then"):
        check_churn(parse_churn("3:leave=agent-1,4:kill=agent-1"), two, 16)
    with pytest.raises(ValueError, match="the last member cannot leave"):
        check_churn(parse_churn("2:leave,3:leave"), two, 16)


def test_the_local_fleet_refuses_a_bad_plan_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args(["--sim", "--steps", "6", "--churn", "2:join,4:leave"])
    assert args.churn == [ChurnEvent(2, "join"), ChurnEvent(4, "leave")]
    placed = parse_args(["--ray", "--churn", "2:join,3:crash=rlcp-agent-0,4:leave"])  # Ray names the members
    assert placed.churn == [ChurnEvent(2, "join"), ChurnEvent(3, "crash", "rlcp-agent-0"), ChurnEvent(4, "leave")]
    for argv, why in [
        (["--sim", "--steps", "6", "--churn", "2:jump"], "--churn: '2:jump': unknown action 'jump'"),
        (["--sim", "--steps", "4", "--churn", "4:join"], "--churn: 4:join: the run has 4 steps"),
        (["--sim", "--agents", "1", "--churn", "2:leave"], "--churn: 2:leave: the last member cannot leave"),
        (["--sim", "--churn", "2:crash"], "--churn: a crash strikes in the middle of a broadcast"),
        (["--sync", "disk", "--churn", "2:crash"], "--churn: a crash strikes in the middle of a broadcast"),
        (["--ray", "--churn", "2:kill=agent-0"], "--churn: 2:kill=agent-0: no member 'agent-0' then"),
        (["--ray", "--churn", "2:join,3:leave=rlcp-agent-2"], "with --ray a leave scales the placement down"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert why in capsys.readouterr().err, argv


class _Agent(AgentProcess):
    """An agent that needs no process: its ports are made up, kill and stop are noted."""

    def __init__(self, name: str, port: int, tmp: Path) -> None:
        super().__init__({}, tmp, name=name)
        self.ports = {"admin_port": port, "inference_port": port + 1}
        self.events: list[str] = []

    def kill(self) -> None:
        self.events.append("kill")

    def stop(self, timeout_s: float | None = None) -> None:
        self.events.append("stop")

    def spawn(self) -> _Agent:
        self.events.append("spawn")
        self.ports = {"admin_port": self.ports["admin_port"] + 100, "inference_port": self.ports["admin_port"] + 101}
        return self

    async def wait_ready_async(self) -> _Agent:
        await asyncio.sleep(0.05)
        return self


async def test_changes_reach_the_listing_in_order_without_blocking_the_steps(tmp_path: Path) -> None:
    listing = ListingServer()
    url = await listing.start()
    agents = {f"agent-{i}": _Agent(f"agent-{i}", 9000 + 10 * i, tmp_path) for i in range(2)}
    for name, a in agents.items():
        listing.list(WorkerSpec(**a.spec(name)))
    joined = asyncio.Event()
    dropped: list[str] = []

    async def start_agent(name: str, index: int) -> AgentProcess:
        await joined.wait()  # a slow start: the steps go on meanwhile
        return _Agent(name, 9000 + 10 * index, tmp_path)

    async def wait_dropped(member: str) -> None:
        dropped.append(member)

    said: list[str] = []
    members = ListedMembers(listing, agents, start_agent, wait_dropped)
    churn = Churn.listed(parse_churn("1:join,2:kill,3:leave=agent-0"), members, say=said.append)
    try:

        async def listed() -> list[str]:
            async with aiohttp.ClientSession() as s, s.get(url) as resp:
                return [w.id for w in parse_listing(await resp.json(), default_flavor="dynamo")]

        churn.on_step(1)
        churn.on_step(2)  # the kill of the newest member (the joiner) waits for its join
        churn.on_step(3)
        await asyncio.sleep(0.1)
        assert churn.landed() == ["leave agent-0 (+0s)"]
        assert await listed() == ["agent-1"]
        joined.set()
        await asyncio.wait_for(churn.finish(), 5)
        assert [c.split(" (+")[0] for c in churn.landed()] == ["join agent-2", "kill agent-2", "restart agent-2"]
        assert churn.landed() == []
        assert await listed() == ["agent-1", "agent-2"]
        assert listing.specs["agent-2"].admin_url == "http://127.0.0.1:9120"  # its new instance
        joiner = agents["agent-2"]
        assert isinstance(joiner, _Agent) and joiner.events == ["kill", "spawn"]
        assert dropped == ["agent-0"]
        assert "agent-0" not in agents and members.down_on_purpose == {"agent-0"}
        assert any("churn after step 2: restart agent-2" in line for line in said), said
    finally:
        await churn.close()
        await listing.close()


async def test_a_crash_strikes_in_its_steps_push_and_returns_once_the_member_is_dead_and_unlisted(
    tmp_path: Path,
) -> None:
    """`on_push` comes from the trainer's thread while its round waits: the crash's SIGKILL and the
    unlisting are done when it returns (the broadcast then meets a dead rank for certain); the
    restart goes on without the trainer; the step's end and a re-formed round strike nothing again."""
    listing = ListingServer()
    await listing.start()
    back = asyncio.Event()

    class _Slow(_Agent):
        async def wait_ready_async(self) -> _Agent:
            await back.wait()  # an engine start-up: the run goes on meanwhile
            return self

    agents: dict[str, AgentProcess] = {f"agent-{i}": _Slow(f"agent-{i}", 9000 + 10 * i, tmp_path) for i in range(2)}
    for name, a in agents.items():
        listing.list(WorkerSpec(**a.spec(name)))
    members = ListedMembers(listing, agents, _never_start, _never_dropped)
    churn = Churn.listed(parse_churn("2:crash=agent-0"), members, say=lambda line: None)
    crashed = agents["agent-0"]
    assert isinstance(crashed, _Slow)
    try:
        churn.on_step(1)
        await asyncio.to_thread(churn.on_push, 1)  # no crash at step 1: nothing happens
        assert crashed.events == [] and list(listing.specs) == ["agent-0", "agent-1"]
        await asyncio.wait_for(asyncio.to_thread(churn.on_push, 2), 5)
        assert crashed.events == ["kill", "spawn"] and list(listing.specs) == ["agent-1"]
        assert [c.split(" (+")[0] for c in churn.landed()] == ["crash agent-0"]
        await asyncio.to_thread(churn.on_push, 2)  # the push's re-formed round: struck once already
        churn.on_step(2)  # the step's end: a crash is not a boundary event
        assert crashed.events == ["kill", "spawn"]
        back.set()
        await asyncio.wait_for(churn.finish(), 5)
        assert [c.split(" (+")[0] for c in churn.landed()] == ["restart agent-0"]
        assert sorted(listing.specs) == ["agent-0", "agent-1"]
    finally:
        await churn.close()
        await listing.close()


async def _never_start(name: str, index: int) -> AgentProcess:
    raise AssertionError(f"no join in this plan: {name}")


async def _never_dropped(member: str) -> None:
    raise AssertionError(f"no leave in this plan: {member}")

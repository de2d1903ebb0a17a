"""Leader election on a Lease, with the real client against the fake API server: two electors
contend and exactly one leads; a leader that cannot renew steps down before its Lease can be
taken, and the other takes over; a leader that shuts down hands the Lease back; and a loss
of leadership cancels the mutations it guards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from rlcp.controlplane.api.errors import to_api_error
from rlcp.controlplane.errors import NotLeader
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.leadership.lease import LeaseElector
from rlcp.controlplane.settings.leader_election import LeaderElectionSettings
from tests.support.k8s import NS, LeaseClock, api_client, wait_for
from tests.support.k8s_fake import FakeKubeApi

pytestmark = pytest.mark.timeout(60)
# The deadlines are judged on a LeaseClock the test moves (tests/support/k8s.py), not on wall
# time: with the loop's clock, a 4.1 s stall of the test's event loop (seen on the loaded CI
# machine) made a leader step down on its own mid-test, whatever renew deadline the test could wait out.
LEASE = dict(lease_name="rl-controlplane", namespace=NS, lease_duration_s=6.0, renew_deadline_s=4.0, retry_period_s=0.5)


class Replica:
    def __init__(self, identity: str, api: client.ApiClient, clock: LeaseClock) -> None:
        self.identity = identity
        self.api = api
        self.leadership = Leadership(identity)
        self.elector = LeaseElector(
            api=api,
            settings=LeaderElectionSettings(identity=identity, enabled=True, **LEASE),
            leadership=self.leadership,
            request_timeout_s=1.0,
            clock=clock,
        )
        self.task = asyncio.create_task(self.elector.run(), name=f"elector-{identity}")

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


@pytest.fixture
def clock() -> LeaseClock:
    return LeaseClock()


@pytest.fixture
async def replicas(fake: FakeKubeApi, clock: LeaseClock) -> AsyncIterator[Any]:
    started: list[Replica] = []

    async def start(identity: str) -> Replica:
        r = Replica(identity, await api_client(fake, identity), clock)
        started.append(r)
        return r

    yield start
    for r in started:
        if not r.task.done():
            await r.stop()
        await r.api.close()


class Overlap:
    """Samples both replicas every few ms: two leaders at once would be caught here."""

    def __init__(self, *rs: Replica) -> None:
        self.rs = rs
        self.both = 0
        self.task = asyncio.create_task(self._run(), name="overlap-monitor")

    async def _run(self) -> None:
        while True:
            if sum(r.leadership.is_leader for r in self.rs) > 1:
                self.both += 1
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        self.task.cancel()


@pytest.fixture
async def overlap() -> AsyncIterator[Any]:
    """Starts an Overlap; stops it at teardown too, so a test that fails half-way does not leave
    it running (a failure before its stop hung the run past the test's timeout)."""
    started: list[Overlap] = []

    def start(*rs: Replica) -> Overlap:
        started.append(Overlap(*rs))
        return started[-1]

    yield start
    for o in started:
        o.stop()
        await asyncio.gather(o.task, return_exceptions=True)


def reads_by(fake: FakeKubeApi, identity: str) -> int:
    return sum(1 for r in fake.requests if r.method == "GET" and "/leases/" in r.path and identity in r.user_agent)


def lease(fake: FakeKubeApi) -> dict[str, Any]:
    obj = fake.get("leases", NS, "rl-controlplane")
    assert obj is not None
    return obj["spec"]


async def test_one_leads_the_other_takes_over_when_renewal_stops(
    fake: FakeKubeApi, replicas: Any, clock: LeaseClock, overlap: Any
) -> None:
    a = await replicas("ctl-a")
    await wait_for(lambda: a.leadership.is_leader, what="a to lead")
    b = await replicas("ctl-b")
    await wait_for(lambda: b.leadership.leader_identity == "ctl-a", what="b to see a as the leader")
    monitor = overlap(a, b)
    assert not b.leadership.is_leader and b.leadership.term == 0
    spec = lease(fake)
    assert spec["holderIdentity"] == "ctl-a" and spec["leaseDurationSeconds"] == 6 and spec["leaseTransitions"] == 0
    assert spec["renewTime"].endswith("Z") and len(spec["renewTime"].split(".")[1]) == 7  # MicroTime: 6 digits + Z
    # a keeps renewing: the Lease record moves, and b stays a follower.
    first_renew = spec["renewTime"]
    await wait_for(lambda: lease(fake)["renewTime"] != first_renew, what="a renewal")
    assert a.leadership.is_leader and not b.leadership.is_leader

    # a's API calls now hang (a partitioned node), and its renew deadline passes: a must step
    # down on its own, with its calls still hanging (each is cut by its own timeout), and before
    # b can take the Lease: at the same moment b, which waits a full lease duration from the last
    # change it saw, still counts the Lease as a's.
    fake.refuse(lambda r: "ctl-a" in r.user_agent, mode="hang")
    # b has read a's last renewal before the clock moves (two reads arrive after the hang: the
    # first was answered and judged), so b counts the lease duration from now.
    seen = reads_by(fake, "ctl-b")
    await wait_for(lambda: reads_by(fake, "ctl-b") >= seen + 2, what="b to read the Lease twice more")
    clock.advance(LEASE["renew_deadline_s"])
    await wait_for(lambda: not a.leadership.is_leader, what="a to step down")
    # The renew deadline decided, not a hung call's answer (there is none) nor another holder.
    assert a.leadership.lost_reason == f"could not renew within renew_deadline_s={LEASE['renew_deadline_s']:g}"
    # b reads the Lease again (two reads arrive: the first was answered and judged) and still follows.
    seen = reads_by(fake, "ctl-b")
    await wait_for(lambda: reads_by(fake, "ctl-b") >= seen + 2, what="b to read the Lease twice more")
    assert not b.leadership.is_leader, "b took over before the Lease had expired"
    clock.advance(LEASE["lease_duration_s"] - LEASE["renew_deadline_s"])
    await wait_for(lambda: b.leadership.is_leader, what="b to take over")
    monitor.stop()
    assert monitor.both == 0
    spec = lease(fake)
    assert spec["holderIdentity"] == "ctl-b" and spec["leaseTransitions"] == 1
    assert b.leadership.term == 1 and a.leadership.term == 1


async def test_a_leader_that_shuts_down_hands_the_lease_back(fake: FakeKubeApi, replicas: Any) -> None:
    a = await replicas("ctl-a")
    await wait_for(lambda: a.leadership.is_leader, what="a to lead")
    b = await replicas("ctl-b")
    await wait_for(lambda: b.leadership.leader_identity == "ctl-a", what="b to follow")
    await a.stop()
    assert not a.leadership.is_leader and a.leadership.lost_reason == "shutting down"
    assert lease(fake)["holderIdentity"] is None  # released, not left to expire
    # The electors' clock stands still (no one moves it here): a Lease left to expire would never
    # expire, so b can only be taking over the released one.
    await wait_for(lambda: b.leadership.is_leader, what="b to take the released Lease")
    assert lease(fake)["holderIdentity"] == "ctl-b"


async def test_a_conflicting_write_is_not_leadership(fake: FakeKubeApi, replicas: Any) -> None:
    """Two replicas read the same free Lease and both try to write it: the resourceVersion
    lets exactly one through; the other gets 409 and leads nothing."""
    api_a, api_b = await api_client(fake, "ctl-a"), await api_client(fake, "ctl-b")
    try:
        la, lb = Leadership("ctl-a"), Leadership("ctl-b")
        settings = {i: LeaderElectionSettings(identity=i, enabled=True, **LEASE) for i in ("ctl-a", "ctl-b")}
        ea = LeaseElector(api=api_a, settings=settings["ctl-a"], leadership=la, request_timeout_s=1.0)
        eb = LeaseElector(api=api_b, settings=settings["ctl-b"], leadership=lb, request_timeout_s=1.0)
        fake.put(
            {
                "kind": "Lease",
                "apiVersion": "coordination.k8s.io/v1",
                "metadata": {"name": "rl-controlplane", "namespace": NS},
                "spec": {"holderIdentity": None, "leaseDurationSeconds": 2, "leaseTransitions": 3},
            }
        )
        # Both read before either writes: every PUT waits until both GETs were answered.
        reads = fake.count("GET", "/leases/")
        held = fake.refuse(lambda r: r.method == "PUT", mode="delay")

        async def release_after_both_reads() -> None:
            await wait_for(lambda: fake.count("GET", "/leases/") >= reads + 2, what="both reads")
            held.until.set()

        with capture_logs() as logs:
            # Each try's deadline only has to outlast the hold (a try cut by it is "failed", which
            # is what a stall past 1.5 s did on a loaded machine): it runs out only if no release comes.
            results = await asyncio.gather(ea._attempt(30), eb._attempt(30), release_after_both_reads())
        outcomes = sorted(results[:2])
        assert outcomes == ["failed", "held"], outcomes
        [conflict] = [e for e in logs if e["event"] == "lease_attempt_conflict"]
        assert "409" in conflict["reason"] and "update Lease rl/rl-controlplane" in conflict["reason"]
        assert lease(fake)["holderIdentity"] in ("ctl-a", "ctl-b")
        assert lease(fake)["leaseTransitions"] == 3  # a released Lease taken over is not a transition
    finally:
        await api_a.close()
        await api_b.close()


async def test_losing_leadership_cancels_guarded_work_and_refuses_new_work() -> None:
    leadership = Leadership("ctl-a")
    with pytest.raises(NotLeader) as refused:
        await leadership.run_as_leader(asyncio.sleep(0), name="early")
    assert to_api_error(refused.value).body() == {
        "error": {
            "code": "not_leader",
            "leader": None,
            "message": "this replica ('ctl-a') does not lead; no leader is known yet",
        }
    }
    leadership.acquired()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def mutation() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    running = asyncio.create_task(leadership.run_as_leader(mutation(), name="POST /v1/rl/pause"))
    await started.wait()
    leadership.lost(leader="ctl-b", reason="test")
    with pytest.raises(NotLeader) as lost:
        await asyncio.wait_for(running, 5)
    assert stopped.is_set()
    assert to_api_error(lost.value).status == 409 and lost.value.leader == "ctl-b"
    assert "POST /v1/rl/pause" in lost.value.message and "'ctl-b'" in lost.value.message
    # The caller's own cancellation still propagates as a cancellation.
    leadership.acquired()
    task = asyncio.create_task(leadership.run_as_leader(asyncio.sleep(3600), name="long"))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leadership.term == 2

"""Two controller replicas in "Kubernetes": both discover real agents (SimEngine) through
EndpointSlices, contend for one Lease and keep the desired state in one ConfigMap, all on
the fake API server through the real client.

One leads and runs operations; the follower serves reads and answers writes with 409
`not_leader` naming the leader. When the leader's API calls hang (a partitioned node), it
steps down on its own: the operation it was running is stopped at once, its reconciler does
nothing, and it refuses writes; the follower takes over, reloads the desired state from the
ConfigMap and converges a worker that restarted meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.controller import Controller, http_transports
from rlcp.controlplane.errors import NotLeader
from rlcp.controlplane.leadership import lease as lease_module
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.persistence.memory import MemoryStore
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.wire.controller.desired import DesiredState
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.faults import Fault
from rlcp.harness.simfleet import TOKEN, SimAgent, start_fleet
from tests.support.k8s import NS, LeaseClock, wait_for
from tests.support.k8s_fake import FakeKubeApi, endpoint, endpoint_slice

pytestmark = pytest.mark.timeout(90)
CTL_TOKEN = "ctl-token"
AUTH = {"Authorization": f"Bearer {CTL_TOKEN}"}
# The electors judge these on a LeaseClock the test moves (tests/support/k8s.py), not on wall
# time: on the loop's clock an event-loop stall longer than the renew deadline (4.1 s was seen on the
# CI machine) made a leader step down on its own mid-test, before the cut or during an update.
LEASE = {"lease_duration_s": 6.0, "renew_deadline_s": 4.0, "retry_period_s": 0.5}


def publish(fake: FakeKubeApi, agents: list[SimAgent]) -> None:
    """One EndpointSlice per agent: they share 127.0.0.1, so each has its own admin port."""
    for a in agents:
        fake.put(
            endpoint_slice(
                f"rl-workers-{a.agent_id}",
                [endpoint(a.agent_id, "127.0.0.1", namespace=NS)],
                ports={"admin": a.port},
                namespace=NS,
            )
        )


def settings(fake: FakeKubeApi, identity: str, tmp_path: Path) -> ControllerSettings:
    return ControllerSettings(
        controller_id="rl-controlplane",
        api={"token": CTL_TOKEN},
        gateway={"port": 0},
        discovery={
            "kind": "kubernetes",
            "kubernetes": {
                "namespace": NS,
                "label_selector": "kubernetes.io/service-name=rl-workers",
                "read_pods": False,
            },
        },
        # A call's deadline, generous: it should only run out on a call the fake never answers (1 s cut a
        # start-up read of the ConfigMap on a loaded machine). It no longer has to sit under the renew
        # deadline: that is judged on the test's clock, and a renewal try is cut at what is left of it.
        kubernetes={"api_url": fake.url, "request_timeout_s": 10.0},
        leader_election={"enabled": True, "identity": identity, "namespace": NS, **LEASE},
        store={"kind": "configmap", "configmap_name": "rl-state", "namespace": NS},
        workers={
            "token": TOKEN,
            "timeout_s": 2,
            "attempts": 2,
            "retry_budget_s": 5,
            "pause_timeout_s": 20,
            "weight_load_timeout_s": 10,
        },
        reconcile={"poll_interval_s": 0.1, "interval_s": 0.1, "backoff_initial_s": 0.1, "backoff_max_s": 0.5},
        allowed_roots=[str(tmp_path)],
        log_format="console",
        log_level="warning",
    )


class Replica:
    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.ctl: Controller = client.server.app[CONTROLLER]

    @property
    def leads(self) -> bool:
        return self.ctl.leadership.is_leader

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        resp = await self.client.request(method, path, json=body, headers=AUTH)
        return resp.status, await resp.json()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> LeaseClock:
    """Every elector the assembly builds in this test runs on one LeaseClock (the assembly
    imports the class when it starts its loops, so the module's name is the seam)."""
    clock = LeaseClock()
    monkeypatch.setattr(lease_module, "LeaseElector", functools.partial(lease_module.LeaseElector, clock=clock))
    return clock


@pytest.fixture
async def cluster(fake: FakeKubeApi, tmp_path: Path, clock: LeaseClock) -> AsyncIterator[Any]:
    agents = await start_fleet(2, [tmp_path])
    publish(fake, agents)
    replicas: list[Replica] = []

    async def start(identity: str) -> Replica:
        client = TestClient(TestServer(assemble(settings(fake, identity, tmp_path), token=CTL_TOKEN)))
        await client.start_server()
        replicas.append(Replica(client))
        return replicas[-1]

    yield agents, start
    for r in replicas:
        await r.client.close()
    for a in agents:
        await a.stop()


def lease_reads_by(fake: FakeKubeApi, identity: str) -> int:
    return sum(1 for r in fake.requests if r.method == "GET" and "/leases/" in r.path and identity in r.user_agent)


def desired_in_configmap(fake: FakeKubeApi) -> dict | None:
    cm = fake.get("configmaps", NS, "rl-state")
    return json.loads(cm["data"]["desired.json"]) if cm else None


async def test_one_leads_the_follower_refuses_writes_and_takes_over(
    fake: FakeKubeApi, cluster: Any, clock: LeaseClock, tmp_path: Path
) -> None:
    agents, start = cluster
    ckpt = {i: write_checkpoint(tmp_path / f"ckpt-{i}", i) for i in (1, 2)}
    a = await start("ctl-a")
    await wait_for(lambda: a.leads, what="ctl-a to lead")
    b = await start("ctl-b")
    await wait_for(lambda: b.ctl.leadership.leader_identity == "ctl-a", what="ctl-b to follow ctl-a")
    for r in (a, b):
        await wait_for(
            lambda r=r: sorted(r.ctl.registry.ids()) == ["w0", "w1"] and all(rec.reachable for rec in r.ctl.members()),
            what="both workers discovered and reached",
        )

    # The leader runs the update and persists the desired state in the ConfigMap.
    status, result = await a.call(
        "POST", "/v1/rl/update_weights", {"version": "v1", "source": {"kind": "disk", "path": str(ckpt[1])}}
    )
    assert status == 200, result
    assert desired_in_configmap(fake)["weight_version"] == "v1"
    assert all(x.service.weight_version == "v1" for x in agents)

    # The follower serves reads (its desired state follows the ConfigMap) ...
    await wait_for(lambda: b.ctl.desired.state.weight_version == "v1", what="ctl-b to follow the desired state")
    status, state = await b.call("GET", "/v1/rl/state")
    assert status == 200 and state["desired"]["weight_version"] == "v1" and len(state["workers"]) == 2
    # ... and refuses every write, naming the leader, without touching a worker.
    touched = [list(x.touched) for x in agents]
    for method, path, body in [
        ("POST", "/v1/rl/pause", {"mode": "abort"}),
        ("POST", "/v1/rl/resume", {}),
        ("DELETE", "/v1/rl/loras/x", None),
        ("POST", "/pause?mode=keep", None),
    ]:
        status, body = await b.call(method, path, body)
        assert status == 409, (path, body)
        assert body["error"]["code"] == "not_leader" and body["error"]["leader"] == "ctl-a"
        assert "'ctl-a'" in body["error"]["message"]
    assert [list(x.touched) for x in agents] == touched
    assert (await b.client.get("/healthz")).status == 200
    ready = await b.client.get("/readyz")  # a leader is elected: the follower is ready, and names it
    assert ready.status == 200 and (await ready.json())["leader"] == "ctl-a"

    # An operation is running on the leader (w0 hangs in pause) when the leader's API calls
    # start to hang and its renew deadline passes: it must step down and stop that operation.
    agents[0].faults["/pause"] = Fault("hang")
    running = asyncio.create_task(a.call("POST", "/v1/rl/pause", {"mode": "keep", "timeout_s": 20}))
    # Hanging at w0, past the operation's store write (the desired state saved before the first
    # pause): a hang set earlier hangs that write, and the answer is the store's 503, not the cut.
    await wait_for(lambda: agents[0].faults.fired("POST", "/pause"), what="the pause to hang at w0")
    assert a.ctl.gate.holder == "pause"
    fake.refuse(lambda r: "(ctl-a)" in r.user_agent, mode="hang")
    # b has read ctl-a's last renewal (two reads arrive after the hang: the first was answered and
    # judged), so it counts the lease duration from the clock's present value.
    seen = lease_reads_by(fake, "ctl-b")
    await wait_for(lambda: lease_reads_by(fake, "ctl-b") >= seen + 2, what="ctl-b to read the Lease twice more")
    clock.advance(LEASE["renew_deadline_s"])
    # Longer than the pause's own 20 s deadline: whichever ends it, the answer says which.
    status, body = await asyncio.wait_for(running, 60)
    assert status == 409 and body["error"]["code"] == "not_leader", body
    # Cut by the lost leadership, not by the pause's own deadline (that answer is not a 409 not_leader) ...
    assert "leadership was lost while POST /v1/rl/pause ran" in body["error"]["message"]
    # ... and lost because the renew deadline passed with the calls hanging, not to another holder.
    assert a.ctl.leadership.lost_reason == f"could not renew within renew_deadline_s={LEASE['renew_deadline_s']:g}"
    assert not a.leads and not b.leads  # b waits out the lease duration first
    agents[0].faults.clear()

    # The follower takes over once the Lease has expired, after the old leader stopped.
    clock.advance(LEASE["lease_duration_s"] - LEASE["renew_deadline_s"])
    await wait_for(lambda: b.leads, what="ctl-b to take over")
    assert b.ctl.leadership.term == 1
    assert fake.get("leases", NS, "rl-controlplane")["spec"]["holderIdentity"] == "ctl-b"

    # A worker restarts (base weights): the new leader converges it to the desired state it
    # read from the ConfigMap; the old leader's reconciler does nothing, and it refuses writes.
    await agents[1].restart()
    await wait_for(
        lambda: a.ctl.registry.get("w1").status is not None and a.ctl.reconciler.needs_work(a.ctl.registry.get("w1")),
        what="ctl-a to see w1 behind",
    )
    assert await a.ctl.reconciler.reconcile_once() == 0
    status, body = await a.call("POST", "/v1/rl/resume", {})
    assert status == 409 and body["error"]["code"] == "not_leader"
    await wait_for(lambda: agents[1].service.weight_version == "v1", what="ctl-b to reconcile w1")
    assert b.ctl.desired.state.weight_version == "v1"

    # The new leader takes writes; the old one, reachable again, follows it.
    status, result = await b.call(
        "POST", "/v1/rl/update_weights", {"version": "v2", "source": {"kind": "disk", "path": str(ckpt[2])}}
    )
    assert status == 200, result
    assert desired_in_configmap(fake)["weight_version"] == "v2"
    fake.refusals.clear()
    # ctl-a's calls that hung before the clear end at their own 10 s deadline first.
    await wait_for(lambda: a.ctl.leadership.leader_identity == "ctl-b", timeout_s=40, what="ctl-a to follow ctl-b")
    status, body = await a.call("POST", "/v1/rl/resume", {})
    assert status == 409 and body["error"]["leader"] == "ctl-b"
    await wait_for(
        lambda: a.ctl.desired.state.weight_version == "v2", timeout_s=40, what="ctl-a to follow the desired state"
    )
    assert not a.leads and b.leads


async def test_gaining_leadership_reloads_the_desired_state() -> None:
    """A new term reloads what the previous leader stored; within a term the leader's own
    state is the truth and is not re-read."""
    store = MemoryStore()
    leadership = Leadership("ctl-b")
    async with aiohttp.ClientSession() as session:
        ctl = Controller(
            ControllerSettings(store={"kind": "memory"}),
            transports=http_transports(session, None),
            store=store,
            leadership=leadership,
        )
        await ctl.load_desired()
        store.saved = DesiredState(weight_version="v7")  # written by the leader meanwhile
        with pytest.raises(NotLeader):
            await ctl.ensure_leading()
        assert await ctl.reconciler.reconcile_once() == 0 and ctl.desired.state.weight_version is None
        leadership.acquired()
        await ctl.ensure_leading()
        assert ctl.desired.state.weight_version == "v7"
        store.saved = DesiredState(weight_version="v8")
        await ctl.ensure_leading()
        assert ctl.desired.state.weight_version == "v7"  # same term: not re-read
        leadership.lost(leader="ctl-a", reason="test")
        leadership.acquired()
        await ctl.reconciler.reconcile_once()  # the reconciler's first pass of a term reloads too
        assert ctl.desired.state.weight_version == "v8" and leadership.term == 2

"""Discovery kind `ray` over a real Ray 2.60.0 head on loopback (rlcp/harness/raycluster.py).

A plain Ray driver (`ray.init(address=..., namespace=...)`, as an RL framework would) places
detached named actors, named as verl names its engines (`vllm_server_{replica}_{node}`), whose
`__repr__` follows the convention (docs/ray.md) and points at real
SimEngine agents served by this test on 127.0.0.1. The controller reads only the dashboard's
HTTP state API; the test alone imports `ray`. Checked: the members and their URLs; actors
outside the namespace or the name prefix are not members; a SIGKILLed actor (max_restarts=-1)
comes back on a new pid with `num_restarts` bumped, a membership change; a dashboard that does
not answer (its process stopped) keeps the last list; a DEAD engine stays a member, unreachable.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlcp.controlplane.discovery.ray import RayActorSource, RayStateError
from rlcp.harness.controller import start_controller
from rlcp.harness.raycluster import RayHead
from rlcp.harness.simfleet import SimAgent
from rlcp.harness.waiting import wait_for
from tests.support import ray as support_ray

# One Ray head at a time in the rest part of scripts/test.sh: tests/harness/test_ray_head.py.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

NAMESPACE = "rlcp-test"
# verl's names for its engine actors, `vllm_server_{replica}_{node}`: the prefix a user of verl
# would configure (its actors would still need the `__repr__` convention, docs/ray.md).
PREFIX = "vllm_server_"


@pytest.fixture(scope="module")
def ray_head() -> Iterator[tuple[RayHead, Any]]:
    """One head for the module and this process connected to it as a driver."""
    import ray

    with support_ray.ray_head(num_cpus=2) as head:
        ray.init(
            address=head.gcs_address,
            namespace=NAMESPACE,
            logging_level="warning",
            log_to_driver=False,
            include_dashboard=False,
        )
        try:
            yield head, ray
        finally:
            ray.shutdown()


def engine_class(ray: Any) -> Any:
    """An engine actor as a framework would write it (defined here so Ray pickles it by value:
    the workers need not import this module)."""

    class Engine:
        def __init__(self, admin_url: str, inference_url: str | None, flavor: str = "agent") -> None:
            self.described = {
                "rlcp": 1,
                "admin_url": admin_url,
                "inference_url": inference_url,
                "flavor": flavor,
                "world_size": 1,
                "model": "sim",
            }

        def __repr__(self) -> str:  # the state API's `repr_name`: how the controller finds us
            return json.dumps(self.described)

        def pid(self) -> int:
            return os.getpid()

    return ray.remote(num_cpus=0, max_restarts=-1)(Engine)


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[list[SimAgent]]:
    started = [await SimAgent(f"a{i}", [tmp_path], serve_inference=True).start() for i in range(2)]
    yield started
    for agent in started:
        await agent.stop()


def place(ray: Any, agents: list[SimAgent], namespace: str) -> dict[str, Any]:
    """Two engines the controller should find, named as verl names its replicas on node 0, and
    two it must not: another prefix, and the same name in another namespace. Detached, as
    engines outlive the driver that placed them."""
    Engine = engine_class(ray)
    actors: dict[str, Any] = {}
    for i, agent in enumerate(agents):
        spec = agent.spec()
        actors[f"{PREFIX}{i}_0"] = Engine.options(
            name=f"{PREFIX}{i}_0", namespace=namespace, lifetime="detached"
        ).remote(spec["admin_url"], spec["inference_url"])
    actors["trainer_0"] = Engine.options(name="trainer_0", namespace=namespace, lifetime="detached").remote(
        agents[0].url, None
    )
    actors[f"elsewhere/{PREFIX}0_0"] = Engine.options(
        name=f"{PREFIX}0_0", namespace=f"{namespace}-elsewhere", lifetime="detached"
    ).remote(agents[0].url, None)
    pids = ray.get([a.pid.remote() for a in actors.values()], timeout=60)  # every one created
    assert len(set(pids)) == 4
    return actors


def kill_all(ray: Any, actors: dict[str, Any]) -> None:
    for actor in actors.values():
        ray.kill(actor, no_restart=True)


def ray_settings(head: RayHead, namespace: str, **kw: Any) -> dict[str, Any]:
    return {
        "kind": "ray",
        "ray": {
            "dashboard_url": head.dashboard_url,
            "namespace": namespace,
            "name_prefix": PREFIX,
            "interval_s": 0.2,
            "timeout_s": 1.0,
            "max_backoff_s": 0.5,
            **kw,
        },
    }


async def test_controller_finds_engines_follows_a_restart_and_keeps_its_list_without_the_dashboard(
    ray_head: tuple[RayHead, Any], agents: list[SimAgent], tmp_path: Path
) -> None:
    head, ray = ray_head
    ns = f"{NAMESPACE}-c"
    actors = place(ray, agents, ns)
    ids = [f"{PREFIX}0_0", f"{PREFIX}1_0"]
    ctl = await start_controller(tmp_path, [], discovery=ray_settings(head, ns))
    try:
        state = await wait_for(lambda: _members(ctl, 2), 15, "both engines reachable")
        workers = {w["id"]: w for w in state["workers"]}
        assert sorted(workers) == ids  # not trainer_0 (prefix), not the same name elsewhere (namespace)
        listening = head.listeners()  # the head, its dashboard and the four engines' workers
        assert len(listening) >= 8 and {a for a, _ in listening} <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, listening
        for i, agent in enumerate(agents):
            assert workers[ids[i]]["admin_url"] == agent.url
            assert workers[ids[i]]["inference_url"] == agent.spec()["inference_url"]
            assert workers[ids[i]]["flavor"] == "agent"
        epoch = state["membership_epoch"]

        # SIGKILL the first engine's process: Ray restarts it (max_restarts=-1) on a new pid.
        old_pid = ray.get(actors[ids[0]].pid.remote(), timeout=10)
        os.kill(old_pid, signal.SIGKILL)
        new_pid = await wait_for(lambda: _alive_pid(head, ns, ids[0], old_pid), 20, "the engine back on a new pid")
        assert new_pid != old_pid
        state = await wait_for(lambda: _epoch_after(ctl, epoch), 10, "the restart seen as a membership change")
        assert sorted(w["id"] for w in state["workers"]) == ids  # changed, never removed
        await wait_for(lambda: _members(ctl, 2), 10, "both reachable after the restart")
        epoch = (await ctl.state())["membership_epoch"]

        # The dashboard stops answering (its process stopped): polls fail, the list stays.
        pid = head.dashboard_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(RayStateError, match="no answer within"):
                    await RayActorSource(session=session, dashboard_url=head.dashboard_url, timeout_s=0.5).poll()
            await asyncio.sleep(2.5)  # more than two of the controller's poll deadlines
            state = await ctl.state()
            assert sorted(w["id"] for w in state["workers"]) == ids
            assert state["membership_epoch"] == epoch and state["discovery_synced"]
        finally:
            os.kill(pid, signal.SIGCONT)

        # An engine gone for good (its actor DEAD, its agent stopped) stays a member, unreachable.
        ray.kill(actors[ids[1]], no_restart=True)
        await agents.pop(1).stop()  # popped: the fixture stops the rest
        state = await wait_for(lambda: _unreachable(ctl, ids[1]), 10, "the dead engine shown unreachable")
        assert sorted(w["id"] for w in state["workers"]) == ids
        assert ctl.worker(state, ids[0])["reachable"]
    finally:
        await ctl.client.close()
        kill_all(ray, actors)


async def test_source_reports_restart_as_a_change_and_a_dead_engine_as_kept(
    ray_head: tuple[RayHead, Any], agents: list[SimAgent]
) -> None:
    head, ray = ray_head
    ns = f"{NAMESPACE}-s"
    actors = place(ray, agents, ns)
    ids = [f"{PREFIX}0_0", f"{PREFIX}1_0"]
    async with aiohttp.ClientSession() as session:
        src = RayActorSource(
            session=session, dashboard_url=head.dashboard_url, namespace=ns, name_prefix=PREFIX, timeout_s=2
        )
        first = {s.id: s for s in await src.poll()}
        assert sorted(first) == ids and first[ids[0]].incarnation == "0"
        assert first[ids[1]].admin_url == agents[1].url
        # more matching actors than the limit: a failed poll, never a partial list
        with pytest.raises(RayStateError, match="returned 1 of"):
            await RayActorSource(
                session=session,
                dashboard_url=head.dashboard_url,
                namespace=ns,
                name_prefix=PREFIX,
                limit=1,
                timeout_s=2,
            ).poll()

        old_pid = ray.get(actors[ids[0]].pid.remote(), timeout=10)
        os.kill(old_pid, signal.SIGKILL)
        await wait_for(lambda: _alive_pid(head, ns, ids[0], old_pid), 20, "the engine back on a new pid")
        after = {s.id: s for s in await src.poll()}
        assert after[ids[0]].incarnation == "1" and after[ids[0]] != first[ids[0]]
        assert after[ids[1]] == first[ids[1]]

        ray.kill(actors[ids[1]], no_restart=True)  # DEAD for good: kept, unreachable once its agent goes
        await wait_for(lambda: _state(head, ns, ids[1]) == "DEAD", 10, "the engine DEAD")
        assert sorted(s.id for s in await src.poll()) == ids
    kill_all(ray, actors)


# -- helpers ------------------------------------------------------------------------------


async def _members(ctl: Any, n: int) -> dict | None:
    state = await ctl.state()
    ws = state["workers"]
    return state if state["discovery_synced"] and len(ws) == n and all(w["reachable"] for w in ws) else None


async def _unreachable(ctl: Any, worker_id: str) -> dict | None:
    state = await ctl.state()
    found = [w for w in state["workers"] if w["id"] == worker_id]
    return state if found and not found[0]["reachable"] else None


async def _epoch_after(ctl: Any, epoch: int) -> dict | None:
    state = await ctl.state()
    return state if state["membership_epoch"] > epoch else None


def _actors(head: RayHead, name: str) -> list[dict]:
    q = urllib.parse.urlencode(
        [("detail", "true"), ("filter_keys", "name"), ("filter_predicates", "="), ("filter_values", name)]
    )
    with urllib.request.urlopen(f"{head.dashboard_url}/api/v0/actors?{q}", timeout=5) as resp:
        return json.load(resp)["data"]["result"]["result"]


def _alive_pid(head: RayHead, namespace: str, name: str, old_pid: int) -> int | None:
    for a in _actors(head, name):
        if a["ray_namespace"] == namespace and a["state"] == "ALIVE" and a["pid"] != old_pid:
            return int(a["pid"])
    return None


def _state(head: RayHead, namespace: str, name: str) -> str | None:
    found = [a["state"] for a in _actors(head, name) if a["ray_namespace"] == namespace]
    return found[0] if found else None

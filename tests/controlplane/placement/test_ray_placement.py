"""Placement kind `ray` over a real Ray 2.60.0 head on loopback (rlcp/harness/raycluster.py).

The controller (its own process, a Ray driver) keeps SimEngine agents as detached actors in a
placement group; `discovery.kind: ray` makes them members. This test never imports `ray`: it
reads the dashboard's state API and kills processes by pid. Checked: two agents placed become
members and serve through the gateway; a disk update goes through; an actor's process SIGKILLed
(then, on another member, the agent child; then an actor in the middle of an update) comes back
through Ray's restart, and the controller converges it to the desired version before the gateway
routes to it (no answer ever carries a fresh agent's base weights: X-RL-Weight-Version is the
version desired when it was sent); scaling live through the API (2 -> 3) and rlctl (3 -> 1)
reshapes the fleet; a new controller whose settings say 2 keeps the 1 the desired state says and
finds its predecessor's actor by name; teardown removes everything.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rlcp.client.client import ControlPlaneClient
from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.controller import AUTH, CTL_TOKEN, rlctl, update_body
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.raycluster import RayHead
from rlcp.harness.waiting import wait_for
from tests.support.ray import NAMESPACE, PREFIX, placement_config, ray_head

# One Ray head at a time in the rest part of scripts/test.sh: tests/harness/test_ray_head.py.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    with ray_head(num_cpus=2, num_gpus=3) as started:  # logical GPUs: one per bundle, up to 3 agents
        yield started


def actors(head: RayHead) -> dict[str, dict[str, Any]]:
    return head.actors(NAMESPACE, PREFIX)


def cuda_visible_devices(pid: int) -> str | None:
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            return item.partition(b"=")[2].decode()
    return None


def groups(head: RayHead) -> list[str]:
    return head.placement_groups(PREFIX)


async def state(http: aiohttp.ClientSession, ctl: ControllerProcess) -> dict[str, Any]:
    async with http.get(f"{ctl.url}/v1/rl/state", headers=AUTH) as resp:
        return dict(await resp.json())


def serving(st: dict[str, Any], n: int, version: str | None = None) -> bool:
    ws = st.get("workers", [])
    return len(ws) == n and all(w["serving"] and (version is None or w["weight_version"] == version) for w in ws)


class Rollouts:
    """Requests through the gateway, one after another, each answer's worker and version kept."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url
        self.answers: list[tuple[float, str, str, int]] = []  # (time, worker, version, status)
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                async with self.http.post(
                    f"{self.url}/v1/completions", json={"model": "sim", "prompt": "hi", "max_tokens": 2}
                ) as resp:
                    await resp.read()
                    self.answers.append(
                        (
                            time.monotonic(),
                            resp.headers.get("X-RL-Worker", ""),
                            resp.headers.get("X-RL-Weight-Version", ""),
                            resp.status,
                        )
                    )
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def kill_and_wait_converged(
    http: aiohttp.ClientSession, ctl: ControllerProcess, head: RayHead, name: str, pid: int, n: int, version: str
) -> float:
    """SIGKILL `pid` (the actor's or its agent's); wait for Ray to restart the actor and the
    controller to serve it again at `version`; the seconds from the kill to serving."""
    before = actors(head)[name]["num_restarts"]
    old_url = next(w["admin_url"] for w in (await state(http, ctl))["workers"] if w["id"] == name)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    await wait_for(
        lambda: actors(head)[name]["num_restarts"] > before and actors(head)[name]["state"] == "ALIVE",
        30,
        f"{name} restarted by Ray",
        interval_s=0.1,
        tolerate=(KeyError,),
    )
    await wait_for(
        lambda: _serving_anew(http, ctl, n, version, name, old_url),
        30,
        f"{name} converged and serving",
        interval_s=0.05,
    )
    return time.monotonic() - t0


async def _serving_anew(
    http: aiohttp.ClientSession, ctl: ControllerProcess, n: int, version: str, name: str, old_url: str
) -> bool:
    """Every member serving at `version`, `name` on its new agent (a new port: a new URL)."""
    st = await state(http, ctl)
    return serving(st, n, version) and any(w["id"] == name and w["admin_url"] != old_url for w in st["workers"])


async def test_placed_agents_serve_restart_converged_and_scale(head: RayHead, tmp_path: Path) -> None:
    root = tmp_path / "weights"
    write_checkpoint(root / "v1", 1)
    ctl = ControllerProcess(
        placement_config(tmp_path / "c1", head, root, replicas=2, teardown=False), tmp_path / "c1", start_timeout_s=90
    )
    gateway = f"http://127.0.0.1:{ctl.config['gateway']['port']}"
    timings: dict[str, float] = {}
    async with aiohttp.ClientSession() as http:
        try:
            t0 = time.monotonic()
            await ctl.spawn().wait_ready_async()
            await wait_for(lambda: _serving(http, ctl, 2), 90, "two placed agents serving", interval_s=0.2)
            timings["place_2_s"] = time.monotonic() - t0
            placed = actors(head)
            assert sorted(placed) == [f"{PREFIX}0", f"{PREFIX}1"]
            assert groups(head) == [f"{PREFIX}group-0-2"]
            st = await state(http, ctl)
            assert sorted(w["id"] for w in st["workers"]) == sorted(placed)
            # Ray gives each actor its bundle's GPU, and the agent it starts inherits it.
            devices = {cuda_visible_devices(json.loads(a["repr_name"])["agent_pid"]) for a in placed.values()}
            assert len(devices) == 2 and None not in devices, devices

            async with http.post(
                f"{ctl.url}/v1/rl/update_weights", headers=AUTH, json=update_body("v1", root / "v1")
            ) as resp:
                assert resp.status == 200, await resp.text()
            await wait_for(lambda: _serving(http, ctl, 2, "v1"), 20, "both at v1", interval_s=0.1)

            rollouts = Rollouts(http, gateway)
            try:
                await wait_for(lambda: len(rollouts.answers) > 5, 10, "answers through the gateway")
                # The actor's process SIGKILLed: its agent child dies with it (PDEATHSIG).
                timings["actor_kill_to_serving_s"] = await kill_and_wait_converged(
                    http, ctl, head, f"{PREFIX}0", placed[f"{PREFIX}0"]["pid"], 2, "v1"
                )
                # The agent child SIGKILLed: the actor exits with it, and Ray restarts the actor.
                agent_pid = json.loads(actors(head)[f"{PREFIX}1"]["repr_name"])["agent_pid"]
                timings["agent_kill_to_serving_s"] = await kill_and_wait_converged(
                    http, ctl, head, f"{PREFIX}1", agent_pid, 2, "v1"
                )
                n = len(rollouts.answers)
                await wait_for(lambda: len(rollouts.answers) > n + 5, 10, "answers after the restarts")
                assert {v for _, _, v, s in rollouts.answers if s == 200} == {"v1"}

                # SIGKILL mid-update: the desired state names v2 before any worker is touched, so
                # the restarted member is converged to v2, whatever the update's own answer says.
                write_checkpoint(root / "v2", 2)
                update = asyncio.create_task(
                    _post(http, f"{ctl.url}/v1/rl/update_weights", update_body("v2", root / "v2"))
                )
                await wait_for(lambda: _loading(http, ctl), 10, "the update loading", interval_s=0.02)
                update_status = 0
                timings["mid_update_kill_to_serving_s"] = await kill_and_wait_converged(
                    http, ctl, head, f"{PREFIX}0", actors(head)[f"{PREFIX}0"]["pid"], 2, "v2"
                )
                update_status = await update
                t_done = time.monotonic()
                await wait_for(
                    lambda: len([a for a in rollouts.answers if a[0] > t_done]) > 5, 10, "answers after the update"
                )
            finally:
                await rollouts.stop()
            ok = [a for a in rollouts.answers if a[3] == 200]
            # never the base weights of a fresh agent: v1, then v2 once the desired state moved
            assert {v for _, _, v, _ in ok} == {"v1", "v2"}, {v for _, _, v, _ in rollouts.answers}
            assert all(v == "v2" for t, _, v, _ in ok if t > t_done)
            assert update_status == 207  # the killed member failed the update, the other took it
            assert {w for _, w, _, _ in ok} == {f"{PREFIX}0", f"{PREFIX}1"}

            # Scale 2 -> 3 live, through the API: one new group for the new bundle, the new agent
            # converged to v2 before it serves.
            async with ControlPlaneClient(ctl.url, token=CTL_TOKEN) as client:
                t0 = time.monotonic()
                view = await client.scale(3)
                assert (view.replicas, view.replicas_from) == (3, "api")
                await wait_for(lambda: _serving(http, ctl, 3, "v2"), 60, "three agents at v2", interval_s=0.2)
                timings["scale_2_to_3_s"] = time.monotonic() - t0
                assert sorted(actors(head)) == [f"{PREFIX}{i}" for i in range(3)]
                assert groups(head) == [f"{PREFIX}group-0-2", f"{PREFIX}group-2-1"]
                await wait_for(lambda: _placed(client, 3), 10, "the placement view shows three", interval_s=0.1)

            # Scale 3 -> 1 with rlctl: the top two go, the straddling group keeps a spare bundle.
            rc, out, err = await rlctl(ctl.url, "scale", "1")
            assert rc == 0 and f"{PREFIX}0" in out, err
            await wait_for(lambda: sorted(actors(head)) == [f"{PREFIX}0"], 30, "scaled to one", interval_s=0.2)
            assert groups(head) == [f"{PREFIX}group-0-2"]
            await wait_for(lambda: _serving(http, ctl, 1, "v2"), 30, "one agent at v2", interval_s=0.2)
            survivor = actors(head)[f"{PREFIX}0"]
        finally:
            ctl.stop()

        # A new controller whose settings say 2: the desired state's 1 (set through the API)
        # wins; it finds its predecessor's actor by name and starts nothing. Teardown on stop.
        ctl2 = ControllerProcess(
            placement_config(tmp_path / "c2", head, root, replicas=2, teardown=True),
            tmp_path / "c2",
            start_timeout_s=90,
        )
        try:
            await ctl2.spawn().wait_ready_async()
            async with ControlPlaneClient(ctl2.url, token=CTL_TOKEN) as client:
                await wait_for(lambda: _placed(client, 1), 30, "a pass by the new controller", interval_s=0.2)
                view = await client.placement()
                assert (view.replicas, view.replicas_from) == (1, "api")
            await wait_for(lambda: _serving(http, ctl2, 1, "v2"), 30, "one agent at v2", interval_s=0.2)
            again = actors(head)
            assert sorted(again) == [f"{PREFIX}0"]
            assert (again[f"{PREFIX}0"]["pid"], again[f"{PREFIX}0"]["num_restarts"]) == (
                survivor["pid"],
                survivor["num_restarts"],
            )
        finally:
            ctl2.stop()
        await wait_for(
            lambda: not actors(head) and not groups(head), 30, "teardown removed actors and groups", interval_s=0.2
        )
    print(
        "placement timings:",
        json.dumps({k: round(v, 2) for k, v in timings.items()}),
        "mid-update answer:",
        update_status,
    )


async def _placed(client: ControlPlaneClient, n: int) -> bool:
    """The controller's last placement pass left `n` agents."""
    view = await client.placement()
    return view.last_pass_at is not None and view.last_error is None and len(view.placed) == n


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with http.post(url, headers=AUTH, json=body) as resp:
        await resp.read()
        return resp.status


async def _loading(http: aiohttp.ClientSession, ctl: ControllerProcess) -> bool:
    """Some member is out of service for the update (paused or cordoned) while it runs."""
    st = await state(http, ctl)
    return any(w["paused"] or w["cordoned"] for w in st["workers"])


async def _serving(http: aiohttp.ClientSession, ctl: ControllerProcess, n: int, version: str | None = None) -> bool:
    try:
        return serving(await state(http, ctl), n, version)
    except aiohttp.ClientError:
        return False

"""A churn plan (`rlcp.harness.churn`) on a fleet the controller places on Ray.

With `placement.kind: ray` the controller keeps `replicas` agents as detached actors named
`<prefix><i>` and discovery (`discovery.kind: ray`, `dead_actors: drop`) lists the live ones. So
the plan's changes are what an operator or an autoscaler does to such a fleet:

    join   `PUT /v1/rl/placement` one replica more: the controller places `<prefix><replicas>`
    leave  one replica less: placement kills the highest index (so a leave takes the newest member)
    kill   SIGKILL the actor's process: Ray restarts the actor (`max_restarts=-1`), which starts a
           fresh agent; discovery drops the member while Ray restarts it and lists the new one

Each call returns once the controller sees the change (its members, as `GET /v1/rl/state` shows
them), within `deadline_s` (an agent's start-up is an engine start-up).
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlcp.client.client import ControlPlaneClient
from rlcp.harness.waiting import wait_for

if TYPE_CHECKING:
    from rlcp.harness.raycluster import RayHead


@dataclass
class PlacedMembers:
    """`churn.Members` for a Ray-placed fleet: scale by one, or SIGKILL an actor's process."""

    client: ControlPlaneClient
    head: RayHead
    namespace: str
    prefix: str  # the actors' name prefix (placement.ray.name_prefix): members are <prefix><i>
    deadline_s: float  # for a change to show in the controller's members (an agent's start-up)
    _urls: dict[str, str] = field(default_factory=dict)  # a killed member's admin URL before its kill

    async def join(self, name: str, index: int) -> None:
        replicas = await self._replicas()
        self._require(name == f"{self.prefix}{replicas}", f"placement adds {self.prefix}{replicas}, not {name}")
        await self.client.scale(replicas + 1)
        await self._listed(name, f"{name} placed and reachable")

    async def leave(self, name: str) -> None:
        replicas = await self._replicas()
        self._require(name == f"{self.prefix}{replicas - 1}", f"placement removes the newest member, not {name}")
        await self.client.scale(replicas - 1)
        await wait_for(lambda: self._gone(name), self.deadline_s, f"{name} dropped", interval_s=0.25)

    async def retire(self, name: str) -> None:
        pass  # placement killed the actor and removed its bundle: nothing of this run's to stop

    async def kill(self, name: str) -> None:
        actors = await asyncio.to_thread(self.head.actors, self.namespace, self.prefix)
        self._require(name in actors, f"no actor {name} (actors: {', '.join(sorted(actors))})")
        before = int(actors[name]["num_restarts"])
        self._urls[name] = next((w.admin_url for w in (await self.client.state()).workers if w.id == name), "")
        os.kill(int(actors[name]["pid"]), signal.SIGKILL)  # its agent child dies with it (PDEATHSIG)

        def noticed() -> bool:
            row = self.head.actors(self.namespace, self.prefix).get(name)
            return row is None or row["state"] != "ALIVE" or int(row["num_restarts"]) > before

        await wait_for(lambda: asyncio.to_thread(noticed), self.deadline_s, f"Ray saw {name} die", interval_s=0.2)

    async def restart(self, name: str) -> None:
        old = self._urls.pop(name, "")
        await self._listed(name, f"{name} restarted by Ray and reachable", not_url=old)

    async def _replicas(self) -> int:
        view = await self.client.placement()
        self._require(view.kind == "ray" and view.replicas is not None, "the controller places no agents on Ray")
        assert view.replicas is not None
        return view.replicas

    async def _listed(self, name: str, what: str, not_url: str = "") -> None:
        async def listed() -> bool:
            return any(
                w.id == name and w.reachable and w.admin_url != not_url for w in (await self.client.state()).workers
            )

        await wait_for(listed, self.deadline_s, what, interval_s=0.25)

    async def _gone(self, name: str) -> bool:
        return all(w.id != name for w in (await self.client.state()).workers)

    @staticmethod
    def _require(ok: bool, why: str) -> None:
        if not ok:
            raise ValueError(f"churn on a placed fleet: {why}")

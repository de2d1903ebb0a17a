"""The `dynamo` flavor: a Dynamo worker's system port, as Dynamo 1.6.1's vLLM worker serves it.

Contracts read from Dynamo's own code (`dynamo.vllm.handlers.BaseWorkerHandler`, registered
by `dynamo.vllm.worker_factory.register_engine_routes` through
`dynamo.common.rl.register_rl_routes`) and checked against it in tests/controlplane/workers/flavors/test_dynamo.py:

- every RL route is `POST /engine/<name>` with a JSON object body and answers a JSON object
  with `"status": "ok" | "error"` and a `message`; a handler's refusal comes back in the
  body, not the HTTP status. It becomes `WorkerRejected(status=200)` here, after the HTTP
  layer returned, so it is never retried -- the worker did answer, and said no;
- `get_weight_version` answers `{"version": v | null, "version_declared": bool}`: a worker
  no one has named weights for reports no version (unknown), not a guessed one;
- `update_weights_from_disk` is refused unless the worker was paused through
  `pause_generation` first (the operations always pause before a reload); it takes
  `model_path` and `weight_version`, declares the version only when one is sent, and resets
  the prefix cache itself, so no separate `flush_cache` follows;
- `pause_generation` takes `mode` keep | wait | abort (default keep) and `clear_cache`;
  keep is refused while LoRA requests are in flight;
- `liveness_probe` checks the engine (`{"alive": true}`); `GET /health` is the runtime's
  readiness (503 until its endpoints serve);
- `control/sleep` `{level}` unregisters the worker's `generate` endpoint (its frontend answers
  a request pinned to it 503), aborts what runs and sleeps; the RL listing keeps the worker.
  `control/wake_up` wakes it, resumes generation and registers it again at once. Both are
  registered by Dynamo's worker factory, not the RL route registry, so the published list never
  names them;
- `load_lora` / `unload_lora` exist only on workers started with LoRA on; the worker's
  published route list (the frontend's `GET /v1/rl/workers` `routes`, kept in
  `WorkerSpec.routes`) says which routes it serves, and `published_capabilities` narrows
  this driver's capabilities to them.

What Dynamo cannot tell or do, and so this driver reports as unknown or lacks:
- pause state: no read route, so the driver reports the state its own calls left the worker
  in. A Dynamo worker process starts unpaused (its handler's `_paused = False`), and a
  restarted one has a new `instance_id`, so a new member and a new driver: that starts at
  "not paused", then follows every pause and resume this controller's driver answered ok.
  Without it the gateway's fence (which admits only members known not paused) could never
  send a rollout to a Dynamo member. What it cannot see: a pause made by someone else on
  the system port, or one left by a controller that died mid-update (docs/gateway.md);
- request counts (no read route): None; loaded LoRAs: empty;
- weight checksums and desired-version gating: not capabilities, so verification is by
  version only;
- broadcast: Dynamo's `init_weights_update_group` / `update_weights_from_distributed` call
  engine RPCs (`init_broadcaster`, `update_weights_from_path`) that a stock vLLM engine does
  not have, and take no transfer plan; not a capability, so a broadcast is refused up front.
"""

from __future__ import annotations

import asyncio
from typing import Any, final

from rlcp.controlplane.workers.capabilities import (
    Capability,
    Control,
    DiskWeights,
    Lora,
    PublishesRoutes,
    Sleep,
    SleepMode,
)
from rlcp.controlplane.workers.flavors.base import DriverBase, SeparateUpdateCalls
from rlcp.controlplane.workers.transport import WorkerRejected
from rlcp.controlplane.workers.updates import DeclaredUpdate
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent.control import PauseMode

# Which of Dynamo's published routes each capability of this driver needs (all of them).
DYNAMO_ROUTES: dict[Capability, tuple[str, ...]] = {
    "control": ("pause_generation", "resume_generation"),
    "disk_weights": ("update_weights_from_disk",),
    "lora": ("load_lora", "unload_lora"),
}
STATUS_ROUTES = ("get_weight_version", "liveness_probe")


# What every Dynamo vLLM worker serves whatever it publishes: its worker factory registers
# `control/sleep` and `control/wake_up` itself (`register_engine_routes`), outside the RL route
# registry that the published list is made from.
UNPUBLISHED: frozenset[Capability] = frozenset({"sleep"})


def capabilities_from_routes(routes: tuple[str, ...]) -> frozenset[Capability]:
    published = set(routes)
    return UNPUBLISHED | frozenset(cap for cap, needed in DYNAMO_ROUTES.items() if published.issuperset(needed))


@final
class DynamoDriver(SeparateUpdateCalls, DriverBase, Control, DeclaredUpdate, DiskWeights, Lora, Sleep, PublishesRoutes):
    """Speaks to one Dynamo worker's system port. A disk update's steps are separate calls
    (`SeparateUpdateCalls`): pause, reload (which resets the prefix cache), resume."""

    flavor = "dynamo"
    engine_prefix = "/engine"
    listing_routes = DYNAMO_ROUTES
    status_routes = STATUS_ROUTES
    _paused = False  # what this driver's own calls left the worker in (see the module docstring)
    _asleep = False  # likewise: Dynamo has no route that reads it
    # Dynamo 1.6.1's wake_up resumes generation and marks the worker awake after any wake, tags
    # or not: a second wake for the rest would be "already awake" and leave them asleep.
    partial_wake = False

    def published_capabilities(self) -> frozenset[Capability] | None:
        return None if self.spec.routes is None else capabilities_from_routes(self.spec.routes)

    async def status(self) -> WorkerStatus:
        body, alive, ready = await asyncio.gather(
            self._engine("get_weight_version", {}), self._engine_alive(), self._ready()
        )
        return WorkerStatus(
            weight_version=_weight_version(body),
            engine_alive=alive,
            paused=self._paused,
            sleeping=self._asleep,
            ready=ready if alive is not False else False,
            not_ready_reason=None if ready is not False else "Dynamo /health: not ready",
        )

    async def pause(self, mode: PauseMode, timeout_s: float) -> None:
        # Dynamo's pause takes no deadline; ours bounds the call. The KV cache is kept so
        # a keep-mode pause can resume without recomputing.
        # Paused from the moment it is asked: a pause that timed out may still take hold.
        self._paused = True
        await self._engine(
            "pause_generation", {"mode": mode, "clear_cache": False}, timeout_s=timeout_s + self.deadlines.grace_s
        )

    async def resume(self) -> None:
        await self._engine("resume_generation", {})
        self._paused = False

    async def sleep(self, level: int, mode: SleepMode, timeout_s: float) -> None:
        # Dynamo's own sleep leaves its frontend's routing, aborts what runs (vLLM's default
        # pause) and sleeps. The RL pause first gives `wait` its meaning -- drain, bounded by
        # our deadline -- and leaves the RL routes' own pause flag set, which a reload after
        # the wake needs. Asleep from the moment it is asked, as a pause is.
        await self.pause(mode, timeout_s)
        self._asleep = True
        await self._engine("control/sleep", {"level": level}, timeout_s=timeout_s + self.deadlines.grace_s)

    async def wake_up(self, tags: list[str] | None) -> None:
        # `partial_wake` is False, so the operation never sends tags here (a 409 before any call).
        await self._engine("control/wake_up", {}, timeout_s=self.deadlines.weight_load_s)
        self._asleep = False
        # Its wake resumes generation and rejoins the frontend's routing at once; the controller
        # returns a woken member to service only once it is verified (and reloaded if it fell
        # behind), so it is paused again until then. What ran in between is aborted.
        await self.pause("abort", self.deadlines.weight_load_s)

    async def update_weights_from_disk(self, path: str, version: str) -> None:
        if self._paused:  # the update transaction paused it first (its own step)
            await self._reload(path, version)
            return
        # The reconciler's call on a running member that is behind (a restarted worker, say):
        # Dynamo reloads only a worker paused through pause_generation. It is outside the fence
        # (not at the desired version), so what it runs is nobody's rollout: abort it rather
        # than let it finish on the new weights. A failed reload leaves it paused (reported so):
        # the next pass reloads it again, and resumes it only once it is at the desired state.
        await self.pause("abort", self.deadlines.weight_load_s)
        await self._reload(path, version)
        await self.resume()

    async def _reload(self, path: str, version: str) -> None:
        # Dynamo resets the prefix cache inside this call, under its pause lock.
        await self._engine(
            "update_weights_from_disk",
            {"model_path": path, "weight_version": version},
            timeout_s=self.deadlines.weight_load_s,
        )

    async def resume_after_update(self) -> WorkerStatus:
        # The update's last step answers a fresh status, so the controller holds the new
        # version before the member returns to the gateway's serving set (uncordoned). Without
        # it the member served again while the registry still named the old version, and the
        # gateway admitted it at that version (seen in tests/e2e/test_dynamo_rollouts.py during
        # a roll at bound 1: answers labelled w1 from w2 weights); an agent refuses such
        # requests itself, a Dynamo worker cannot.
        await self.resume()
        return await self.status()

    async def load_lora(self, name: str, path: str, version: str | None, *, checksums: bool = False) -> None:
        # No checksums: not a capability of this flavor (the module docstring).
        await self._engine(
            "load_lora", {"lora_name": name, "source": {"uri": path}}, timeout_s=self.deadlines.weight_load_s
        )

    async def unload_lora(self, name: str) -> None:
        await self._engine("unload_lora", {"lora_name": name})

    # -- helpers ------------------------------------------------------------------------
    async def _engine(self, route: str, body: dict[str, Any], *, timeout_s: float | None = None) -> Any:
        path = f"/engine/{route}"
        answer = await self.transport.request("POST", path, json_body=body, timeout_s=timeout_s)
        if isinstance(answer, dict) and answer.get("status") == "error":
            message = answer.get("message") or answer.get("error") or "no message"
            raise WorkerRejected(self.spec.id, f"POST {path} answered an error: {message}", status=200)
        return answer

    async def _engine_alive(self) -> bool | None:
        """Dynamo's `liveness_probe`: the engine answers. An error answer means it did not."""
        try:
            answer = await self.transport.request("POST", "/engine/liveness_probe", json_body={})
        except WorkerRejected as exc:
            if exc.status == 404:
                return None  # an older worker without the route: liveness unknown
            raise
        return isinstance(answer, dict) and answer.get("status") == "ok" and answer.get("alive") is not False

    async def _ready(self) -> bool | None:
        try:
            await self.transport.request("GET", "/health")
        except WorkerRejected as exc:
            if exc.status == 404:
                return None  # a system port without /health: readiness unknown
            if exc.status is not None and exc.status >= 500:
                return False  # Dynamo answers 503 `notready` until its endpoints serve
            raise
        return True


def _weight_version(body: Any) -> str | None:
    """The version from Dynamo's `get_weight_version` answer: `{"version": v, "version_declared": b}`.
    An undeclared version is None (unknown). Older shapes (`weight_version`) are still read."""
    if not isinstance(body, dict) or body.get("version_declared") is False:
        return None
    for key in ("version", "weight_version"):
        if body.get(key) is not None:
            return str(body[key])
    return None

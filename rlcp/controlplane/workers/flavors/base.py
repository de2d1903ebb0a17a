"""What every driver holds (its worker's spec, the transport that reaches it, its deadlines) and
what every flavor's class says about itself (`DriverBase`'s class attributes: its name, the routes a
listing advertises for it; how the gateway reaches it is the data plane's, `workerspec.FLAVOR_REQUESTS`),
and the disk update's steps composed from separate calls, declared (`update_steps`, see
`workers/updates.py`), for a flavor whose engine has no staged update (stock vLLM, Dynamo, SGLang).

Adding a flavor: one module here that subclasses `DriverBase` with its facts and the capabilities'
Protocols it implements, and one line in `workerspec.FLAVOR_DRIVERS`."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.workers.capabilities import (
    DESIRED_VERSION,
    DISK_WEIGHTS,
    Capability,
    Control,
    DiskWeights,
    LoadReport,
    SleepMode,
    UpdateReport,
    implements,
)
from rlcp.controlplane.workers.steps import Step, status_answer
from rlcp.controlplane.workers.transport import WorkerRejected, WorkerTransport
from rlcp.controlplane.workers.updates import UpdateSteps, WaveUpdate
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus
from rlcp.core.wire.agent.control import PauseMode

# What a member can do, advertised as `routes` per capability in this controller's listing
# (`discovery/http_listing.py`), for the flavors that publish no route list of their own.
OUR_ROUTES: Mapping[Capability, tuple[str, ...]] = {
    "control": ("pause", "resume"),
    "disk_weights": ("update_weights",),
    "lora": ("load_lora", "unload_lora"),
    "checksums": ("weight_checksums",),
    "desired_version": ("set_desired_version",),
    "staged_update": ("prepare_update",),
    "broadcast": ("init_weight_transfer", "start_weight_update", "finish_weight_update"),
}


class DriverBase:
    """A driver's state, and its flavor's facts as class attributes (each flavor sets its own)."""

    flavor: ClassVar[str]  # its name in `workerspec.FLAVOR_DRIVERS`
    engine_prefix: ClassVar[str] = ""  # where the engine's own routes sit under the admin URL (Dynamo: /engine)
    # Discovery: the routes this controller's listing advertises per capability, and those it
    # always lists (Dynamo's status reads), so a controller reading the listing narrows capabilities
    # as it does reading the flavor's own listing.
    listing_routes: ClassVar[Mapping[Capability, tuple[str, ...]]] = OUR_ROUTES
    status_routes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, spec: WorkerSpec, transport: WorkerTransport, deadlines: DriverDeadlines) -> None:
        self.spec = spec
        self.transport = transport
        self.deadlines = deadlines

    def answer_field(self, body: Any, key: str, what: str) -> Any:
        """`body[key]` of an engine's JSON answer to `what`; a rejection naming both if it is missing."""
        if not isinstance(body, dict) or key not in body:
            raise WorkerRejected(self.spec.id, f"{what} answered without {key!r}", status=200)
        return body[key]

    async def engine_call(self, method: Literal["GET", "POST"], route: str, body: Any) -> Any:
        """One engine route, as it is (`EngineRoutes`). Not retried: the controller does not know
        whether an allowlisted route is idempotent."""
        return await self.transport.request(method, f"{self.engine_prefix}/{route}", json_body=body, retry=False)


class AdapterVersions(DriverBase):
    """The version this driver loaded each adapter as, for engines that keep none (stock vLLM,
    SGLang). Both list adapters in `GET /v1/models` as cards with a `parent` (the base model) and
    the path loaded as `root`. Reported as unknown, a versioned desired adapter never matched, and
    the reconciler reloaded it on every pass (an adapter missing for a moment each time). A version
    is named while the engine still shows the path this driver loaded; a restarted engine lists no
    adapters, and one this driver did not load (the controller restarted) reads as unknown once and
    is reloaded."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._adapter_loads: dict[str, tuple[str, str | None]] = {}  # name -> (path, version)

    def adapter_loaded(self, name: str, path: str, version: str | None) -> None:
        self._adapter_loads[name] = (path, version)

    def adapter_unloaded(self, name: str) -> None:
        self._adapter_loads.pop(name, None)

    def listed_adapters(self, models: Any) -> dict[str, str | None]:
        """Adapter name -> version, from the engine's `GET /v1/models` answer."""
        cards = self.answer_field(models, "data", "GET /v1/models")
        return {
            str(card["id"]): self._version(str(card["id"]), card.get("root"))
            for card in cards
            if isinstance(card, dict) and card.get("parent")
        }

    def _version(self, name: str, root: Any) -> str | None:
        path, version = self._adapter_loads.get(name, (None, None))
        return version if path is not None and path == root else None


class VllmServerInfoRoute(DriverBase):
    """vLLM's dev route `GET /server_info?config_format=json` (the agent serves the same)."""

    async def server_config(self) -> dict[str, Any]:
        body = await self.transport.request("GET", "/server_info", params={"config_format": "json"})
        config = self.answer_field(body, "vllm_config", "GET /server_info")
        if not isinstance(config, dict):
            raise WorkerRejected(self.spec.id, "GET /server_info answered a vllm_config that is no object", status=200)
        return config


class VllmSleepRoutes(DriverBase):
    """vLLM's sleep mode over its dev routes (`vllm/entrypoints/serve/dev/sleep`), which the agent
    serves in the same shapes: `POST /sleep?level=&mode=`, `POST /wake_up?tags=`. Neither is
    retried: a sleep that timed out may still be taking hold (the status read says), and the
    operation decides what follows."""

    partial_wake = True

    async def sleep(self, level: int, mode: SleepMode, timeout_s: float) -> None:
        # The agent bounds the engine's sleep itself with `timeout_s`; stock vLLM ignores it.
        await self.transport.request(
            "POST",
            "/sleep",
            params={"level": level, "mode": mode, "timeout_s": timeout_s},
            timeout_s=timeout_s + self.deadlines.grace_s,
            retry=False,
        )

    async def wake_up(self, tags: list[str] | None) -> None:
        # Waking moves the weights back into accelerator memory: a load's deadline, not a control call's.
        await self.transport.request(
            "POST",
            "/wake_up",
            params={"tags": tags} if tags else None,
            timeout_s=self.deadlines.weight_load_s,
            retry=False,
        )


class VllmCacheRoutes(DriverBase):
    """vLLM's prefix-cache reset over its dev route (`vllm/entrypoints/serve/dev/cache`), which the
    agent serves in the same shape: `POST /reset_prefix_cache?reset_running_requests=&reset_external=`
    answering `{"success": bool}`. Idempotent, so retried."""

    async def reset_prefix_cache(self, *, running: bool, external: bool) -> None:
        params = {"reset_running_requests": str(running).lower()} | ({"reset_external": "true"} if external else {})
        body = await self.transport.request("POST", "/reset_prefix_cache", params=params)
        if isinstance(body, dict) and body.get("success") is False:
            held = "" if running else "; reset_running_requests=true preempts them"
            raise WorkerRejected(
                self.spec.id,
                f"POST /reset_prefix_cache answered success=false (blocks still held by running requests){held}",
                status=200,
            )


class _Reloads(Control, Protocol):
    async def update_weights_from_disk(self, path: str, version: str) -> None: ...


class SeparateUpdateCalls:
    """The update transaction's steps (`DiskWeights`) as separate calls that answer nothing:
    the worker is told the desired version where it gates readiness on it, then paused; the
    load is the flavor's own reload; the resume a plain resume. The operation reads versions,
    checksums and statuses afterwards."""

    loads_with_checksums = False

    def update_steps(self, update: WaveUpdate, wave: Sequence[DiskWeights]) -> UpdateSteps:
        """The disk update in three calls (`DeclaredUpdate`): `pause` (`pause_for_update`), then
        `update` (`load_from_disk`); `resume_after_update` once verified. The load is given
        hashing time only in a wave where some load answers checksums."""
        d = update.deadlines

        def pause(w: DiskWeights) -> Awaitable[WorkerStatus | None]:
            return w.pause_for_update(update.version, update.mode, update.pause_s, weights_path=None)

        async def load(w: DiskWeights) -> UpdateReport:
            return UpdateReport(await w.load_from_disk(update.path, update.version, checksums=update.checksums), None)

        hashing = update.checksums and any(w.loads_with_checksums for w in wave)
        return UpdateSteps(
            Step(
                name="update",
                can=DISK_WEIGHTS,
                call=load,
                deadline_s=d.load_step(update.requested_s, checksums=hashing),
            ),
            pause=Step(
                name="pause",
                can=DISK_WEIGHTS,
                call=pause,
                deadline_s=d.call_over(update.pause_s),
                observe=status_answer,
            ),
        )

    async def pause_for_update(
        self: _Reloads, version: str, mode: PauseMode, timeout_s: float, *, weights_path: str | None = None
    ) -> None:
        # `weights_path` is for a worker that checks the checkpoint again as it pauses: these cannot.
        if implements(self, DESIRED_VERSION):
            await self.set_desired_version(version)
        await self.pause(mode, timeout_s)

    async def load_from_disk(self: _Reloads, path: str, version: str, *, checksums: bool) -> LoadReport | None:
        # No checksums in the answer: `loads_with_checksums` is False, so they are read afterwards.
        await self.update_weights_from_disk(path, version)
        return None

    async def resume_after_update(self: _Reloads) -> WorkerStatus | None:
        # None: the operation reads statuses afterwards (a flavor may answer one here).
        await self.resume()
        return None

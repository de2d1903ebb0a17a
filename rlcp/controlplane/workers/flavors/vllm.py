"""The `vllm` flavor: a stock `vllm serve` started with VLLM_SERVER_DEV_MODE=1.

Dev mode mounts vLLM's RL router (`vllm/entrypoints/rl/online/api_router.py`) and its dev
routes (`/collective_rpc`, `/reset_prefix_cache`); LoRA load/unload additionally need
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True. Stock vLLM has no single state read, so `status`
gathers five small reads at once, and it has no disk update with a version, so that is
composed from `collective_rpc reload_weights` + `/update_weight_version` +
`/reset_prefix_cache`.

Limits of this flavor, all from stock vLLM:
- no request counts, no desired-version readiness gating: those fields are None, and
  `ready` is just "the engine is alive"; no LoRA versions either: an adapter's version is
  the one this driver loaded it with, while `/v1/models` still shows that path;
- the weight version of a fresh server is vLLM's placeholder "default" (`/weight_info`),
  so a restarted server is behind any version the controller set and is reloaded before it counts;
- a failed `reload_weights` (a directory without this model's tensors) answers 500 and leaves the model
  half-reloaded: the next forward kills the engine core and the server exits. A worker
  whose reload failed therefore stays paused (the update transaction's rule) until a good
  reload, and must not be resumed onto those weights;
- `/pause` takes no deadline: in wait mode vLLM drains without limit, so only our call
  deadline bounds it and the engine may still be pausing afterwards (`/is_paused` tells);
- `/v1/unload_lora_adapter` only forgets the name in the API server; the engine keeps the
  adapter (vLLM never calls `remove_lora` there; `collective_rpc list_loras` still lists
  its id afterwards). `/collective_rpc {"method": "remove_lora", "args": [id]}` does reach
  the workers -- it is exactly what the engine core's `remove_lora` does -- but the
  integer id is assigned inside the API server and never exposed over HTTP (`/v1/models`
  shows name, path and parent only; the unload request's `lora_int_id` is ignored), and
  ids are not predictable (a request for an unknown name consumes one). Guessing could
  evict another adapter, so this flavor does not. The adapter stays in the workers' LRU
  cache (bounded by max_loras / max_cpu_loras) until LRU pressure or a restart frees it.
  Use the `agent` flavor where that matters.
- sleep mode (`/sleep`, `/wake_up`, `/is_sleeping`, dev routes) is vLLM's own: `/is_sleeping` is
  true for a merely paused server too, so a paused server's sleep is reported unknown (the
  controller's desired state says which members it put to sleep); vLLM's CPU build accepts
  sleep and wake_up and ignores them (a warning; the memory stays where it was);
- `/weight_checker` hashes the base model's parameters only: the adapters a server holds are
  not in its checksums, so verification cannot tell two servers' adapter bytes apart (the
  `agent` flavor's checksums cover them). On the CPU it hashes no bytes for the linear layers
  (vLLM moved their weights into its kernels): verification leaves those tensors out and says
  so (`operations/verify.py`); the `agent` flavor reads them back and compares them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, final

from rlcp.controlplane.workers.capabilities import (
    BroadcastPeer,
    Checksums,
    Control,
    DiskWeights,
    LoadReport,
    Lora,
    PrefixCache,
    ServerConfig,
    Sleep,
)
from rlcp.controlplane.workers.flavors.base import (
    AdapterVersions,
    SeparateUpdateCalls,
    VllmCacheRoutes,
    VllmServerInfoRoute,
    VllmSleepRoutes,
)
from rlcp.controlplane.workers.flavors.vllm_rl import VllmWeightTransferRoutes
from rlcp.controlplane.workers.transport import WorkerRejected
from rlcp.controlplane.workers.updates import DeclaredUpdate
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent.control import PauseMode


@final
class VllmDriver(
    AdapterVersions,
    VllmServerInfoRoute,
    SeparateUpdateCalls,
    VllmWeightTransferRoutes,
    VllmSleepRoutes,
    VllmCacheRoutes,
    Control,
    DeclaredUpdate,
    DiskWeights,
    Checksums,
    Lora,
    BroadcastPeer,
    Sleep,
    PrefixCache,
    ServerConfig,
):
    """Speaks to one `vllm serve` in dev mode. A disk update's steps are separate calls
    (`SeparateUpdateCalls`): pause, the composed reload below (answering the version and
    checksums), resume."""

    flavor = "vllm"
    loads_with_checksums = True  # its load hashes the new weights in the same step

    async def status(self) -> WorkerStatus:
        reads = await asyncio.gather(
            self._engine_alive(),
            self.transport.request("GET", "/is_paused"),
            self.transport.request("GET", "/weight_info"),
            self.transport.request("GET", "/v1/models"),
            self.transport.request("GET", "/get_world_size"),
            self.transport.request("GET", "/is_sleeping"),
            return_exceptions=True,
        )
        alive, paused, info, models, world, sleeping = reads
        if isinstance(alive, BaseException):
            raise alive  # unreachable or timed out: the worker as a whole is not observable
        if alive is False:
            # A dead engine fails the other reads with 500s; report it as dead, not as an error.
            return WorkerStatus(engine_alive=False, ready=False, not_ready_reason="engine dead (/health answered 5xx)")
        for result in (paused, info, models, world, sleeping):
            if isinstance(result, BaseException):
                raise result
        is_paused = bool(self.answer_field(paused, "is_paused", "GET /is_paused"))
        is_sleeping = bool(self.answer_field(sleeping, "is_sleeping", "GET /is_sleeping"))
        return WorkerStatus(
            paused=is_paused,
            # vLLM's is_sleeping is also true for a plain pause (its scheduler is paused either
            # way), so a paused server's sleep is unknown; a running one is certainly awake.
            sleeping=None if is_paused and is_sleeping else is_sleeping,
            weight_version=_str_or_none(self.answer_field(info, "weight_version", "GET /weight_info")),
            loras=self.listed_adapters(models),
            engine_alive=True,
            ready=True,  # stock vLLM has no desired-version gating
            world_size=int(self.answer_field(world, "world_size", "GET /get_world_size")),
        )

    async def pause(self, mode: PauseMode, timeout_s: float) -> None:
        await self.transport.request(
            "POST", "/pause", params={"mode": mode}, timeout_s=timeout_s + self.deadlines.grace_s
        )

    async def resume(self) -> None:
        await self.transport.request("POST", "/resume")

    async def update_weights_from_disk(self, path: str, version: str) -> None:
        await self.load_from_disk(path, version, checksums=False)

    async def load_from_disk(self, path: str, version: str, *, checksums: bool) -> LoadReport:
        """Two rounds: the reload, then at once the version named, the prefix cache dropped and
        (if asked) the new weights hashed -- none of the three depends on another, each only on
        the reload. Answers the version the server took and the checksums, so nothing is read
        again to verify."""
        # No engine-side "timeout" in the body on purpose: vLLM's multiproc executor raises on
        # it without draining the late reply, which the next collective_rpc would then read.
        # Not retried: a 500 here is the worker's own exception (a path without this model's
        # tensors, say), the same on every try; the reconciler's backoff is the retry.
        await self.transport.request(
            "POST",
            "/collective_rpc",
            json_body={"method": "reload_weights", "kwargs": {"weights_path": path}},
            timeout_s=self.deadlines.weight_load_s,
            retry=False,
        )
        # vLLM's reload keeps the prefix cache: blocks computed with the old weights would be served.
        named, _, sums = await _all(
            self.transport.request("POST", "/update_weight_version", json_body={"new_version": version}),
            self._reset_prefix_cache(),
            self.weight_checksums() if checksums else _nothing(),
        )
        return LoadReport(
            weight_version=_str_or_none(self.answer_field(named, "new_version", "POST /update_weight_version")),
            checksums=sums,
        )

    async def weight_checksums(self) -> dict[str, str] | None:
        try:
            body = await self.transport.request(
                "POST", "/weight_checker", json_body={"action": "checksum"}, timeout_s=self.deadlines.weight_load_s
            )
        except WorkerRejected as exc:
            if exc.status == 404:
                return None  # a vLLM without the weight checker: verify by version only
            raise
        checksums = self.answer_field(body, "checksums", "POST /weight_checker")
        if not isinstance(checksums, dict):
            raise WorkerRejected(self.spec.id, "POST /weight_checker: 'checksums' is not an object", status=200)
        return {str(k): str(v) for k, v in checksums.items()}

    covers_adapters = False  # `/weight_checker` hashes the base model's parameters only

    async def load_lora(self, name: str, path: str, version: str | None, *, checksums: bool = False) -> None:
        # No checksums answered: this flavor's do not cover adapters (`covers_adapters`).
        # load_inplace makes a second load under the same name a hot swap instead of a 400.
        await self.transport.request(
            "POST",
            "/v1/load_lora_adapter",
            json_body={"lora_name": name, "lora_path": path, "load_inplace": True},
            timeout_s=self.deadlines.weight_load_s,
        )
        self.adapter_loaded(name, path, version)
        # Prefix blocks are keyed by (name, path): a swap from the same path would reuse stale blocks.
        await self._reset_prefix_cache()

    async def unload_lora(self, name: str) -> None:
        # Frees the name only; the engine keeps the adapter (see the module docstring).
        self.adapter_unloaded(name)
        try:
            await self.transport.request("POST", "/v1/unload_lora_adapter", json_body={"lora_name": name})
        except WorkerRejected as exc:
            if exc.status != 404:
                raise  # 404 is "cannot be found": already unloaded, so idempotent success

    # -- broadcast weight transfer: vLLM's RL routes (shared), plus a cache reset ------
    async def finish_weight_update(self, version: str | None) -> None:
        await super().finish_weight_update(version)
        # Like reload, vLLM's finish keeps the prefix cache; the reset is idempotent, so retried.
        await self._reset_prefix_cache()

    # -- helpers ------------------------------------------------------------------------
    async def _engine_alive(self) -> bool:
        try:
            await self.transport.request("GET", "/health")
        except WorkerRejected as exc:
            if exc.status is not None and exc.status >= 500:
                return False  # vLLM answers 503 once the engine core died
            raise
        return True

    async def _reset_prefix_cache(self) -> None:
        # reset_running_requests preempts running requests so their KV is recomputed with the
        # new weights and the reset cannot fail on blocks they hold.
        await self.reset_prefix_cache(running=True, external=False)


async def _nothing() -> None:
    return None


async def _all(*calls: Awaitable[Any]) -> list[Any]:
    """Every call to its end (none left running unobserved), then the first failure raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)

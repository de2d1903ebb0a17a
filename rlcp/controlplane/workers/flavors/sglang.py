"""The `sglang` flavor: SGLang's own server (`python -m sglang.launch_server`), as slime, Miles,
AReaL, SkyRL and verl's SGLang rollouts run it. Contracts read from SGLang 0.5.23's
`srt/entrypoints/http_server.py` and `srt/managers/io_struct.py`, and checked against the running
server in tests/e2e/test_sglang.py.

SGLang's RL surface, and what this driver does about each of its traps (none may reach the trainer):

- pause: `POST /pause_generation {mode}` with SGLang's modes `abort` (the default: aborted requests
  still answer 200, finish reason `abort`, with their partial tokens), `retract` (KV freed, requests
  re-queued and recomputed after `/continue_generation`) and `in_place` (batch and KV kept). Ours map:
    abort -> `abort` (the same meaning as vLLM's);
    keep  -> `retract`: requests are kept and finish after the resume, their KV recomputed with
             whatever weights are loaded then (their answers carry both versions in
             `weight_versions` spans). Never `in_place`: its KV from the old weights would survive an
             update (a `flush_cache` update then answers 400 "weights were updated, but the cache
             was not flushed" although the weights changed: a version half-moved);
    wait  -> SGLang has no drain mode: poll `GET /v1/loads` until nothing runs or waits (bounded by
             the pause's deadline), then `retract`, which then retracts nothing. A drain that does not
             finish in time still pauses (retract: what is left is kept) and the call fails, saying so.
- disk update: one call, `POST /update_weights_from_disk {model_path, weight_version,
  flush_cache: true, abort_all_requests: false}`: the version is declared in the same call, the
  prefix cache flushed with it (`flush_cache: false` would serve KV from the old weights), and never
  abort-all (with in-flight requests it raced: 200 in 3 of 5 runs, 400 in 2). SGLang moves its
  tokenizer manager's version only when the call succeeds, so the driver then reads `/model_info`
  and reports that version (`LoadReport`): verification compares what the server says it holds,
  not what was asked. SGLang can give no per-parameter checksums of the whole model (its
  `/weights_checker` answers one opaque checksum per engine, computed only on GPU builds), so
  verification is by version.
- `/update_weight_version` aborts everything in flight unless told `abort_all_requests: false`:
  this driver never calls it (the version travels with the load).
- After a disk update SGLang serves the model under the new path's name (`/model_info`
  `served_model_name` and `/v1/models` become the directory), yet still answers the old name: the
  status reports the spec's `model` where discovery named one, else the name this driver saw before
  the rename, else none (never a directory: clients would be routed by it).
- sleep / wake: `/release_memory_occupation` / `/resume_memory_occupation` (tags `weights`,
  `kv_cache`), after a pause; on the CPU both are accepted and free nothing. SGLang has no read of
  it: the driver reports what its own calls left the server in.
- flush: `POST /flush_cache` answers 400 while requests run; `reset_prefix_cache(running=True)`
  passes `?timeout=` so SGLang waits for them.
- LoRA: `/load_lora_adapter {lora_name, lora_path}`, `/unload_lora_adapter {lora_name}`; loading a
  name that is loaded is refused by SGLang, so a swap unloads it first.
- versions per answer: `meta_info.weight_version` (native `/generate`) or `metadata.weight_version`
  (OpenAI routes), and `weight_versions` spans `[{version, start, end}]`: the gateway holds an
  answer to the version the fence chose (`answers_name_version`).
- broadcast (`/init_weights_update_group`, `/begin_weight_update`, `/update_weights_from_distributed`,
  `/end_weight_update`, `/destroy_weights_update_group`): not a capability of this driver yet (its
  group takes names, dtypes and shapes per call, not vLLM's transfer plan); a broadcast over a
  fleet with SGLang members is refused up front, naming them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar, final

from rlcp.controlplane.workers.capabilities import Control, DiskWeights, LoadReport, Lora, PrefixCache, Sleep, SleepMode
from rlcp.controlplane.workers.flavors.base import DriverBase, SeparateUpdateCalls
from rlcp.controlplane.workers.transport import WorkerRejected
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent import PauseMode, RequestCounts

# Ours -> SGLang's (see the module docstring); `wait` drains first, then pauses so.
_SGLANG_MODE: dict[PauseMode, str] = {"abort": "abort", "keep": "retract", "wait": "retract"}
_DRAIN_POLL_S = 0.2


@final
class SglangDriver(SeparateUpdateCalls, DriverBase, Control, DiskWeights, Lora, Sleep, PrefixCache):
    """Speaks to one SGLang server (its HTTP port is both its admin and its inference URL)."""

    flavor = "sglang"
    answers_name_version: ClassVar[bool] = True
    partial_wake = True
    _paused = False  # SGLang has no read of its pause: what this driver's calls left it in
    _asleep = False  # likewise for memory occupation
    _served_name: str | None = None  # the name it served before a disk update renamed it

    async def status(self) -> WorkerStatus:
        info, loads, models = await asyncio.gather(
            self.transport.request("GET", "/model_info"),
            self.transport.request("GET", "/v1/loads"),
            self.transport.request("GET", "/v1/models"),
        )
        version = self.answer_field(info, "weight_version", "GET /model_info")
        served = self.answer_field(info, "served_model_name", "GET /model_info")
        renamed = served == self.answer_field(info, "model_path", "GET /model_info")  # a directory, not a name
        if self._served_name is None and not renamed:
            self._served_name = str(served)
        return WorkerStatus(
            paused=self._paused,
            sleeping=self._asleep,
            weight_version=None if version is None else str(version),
            requests=_counts(loads, self.spec.id),
            loras=self._loras(models),
            engine_alive=True,
            ready=True,
            model=self.spec.model or self._served_name or (None if renamed else str(served)),
        )

    async def pause(self, mode: PauseMode, timeout_s: float) -> None:
        self._paused = True  # paused from the moment it is asked: a pause that timed out may still take hold
        drained = True
        if mode == "wait":
            drained = await self._drain(timeout_s)
        await self._post(
            "/pause_generation", {"mode": _SGLANG_MODE[mode]}, timeout_s=timeout_s + self.deadlines.grace_s
        )
        if not drained:
            raise WorkerRejected(
                self.spec.id,
                f"wait-mode pause: requests still ran after {timeout_s:g}s; paused "
                "with them kept (SGLang's retract), to finish after the resume",
                status=200,
            )

    async def resume(self) -> None:
        await self._post("/continue_generation", {})
        self._paused = False

    async def update_weights_from_disk(self, path: str, version: str) -> None:
        await self._load(path, version)

    async def load_from_disk(self, path: str, version: str, *, checksums: bool) -> LoadReport:
        await self._load(path, version)
        info = await self.transport.request("GET", "/model_info")
        held = self.answer_field(info, "weight_version", "GET /model_info")
        return LoadReport(weight_version=None if held is None else str(held), checksums=None)

    async def _load(self, path: str, version: str) -> None:
        # Unpaused (the reconciler's call on a member outside the fence), SGLang itself waits for
        # what runs before loading, under its model-update lock; paused, it loads at once.
        await self._post(
            "/update_weights_from_disk",
            {"model_path": path, "weight_version": version, "flush_cache": True, "abort_all_requests": False},
            timeout_s=self.deadlines.weight_load_s,
            retry=False,
        )

    async def load_lora(self, name: str, path: str, version: str | None, *, checksums: bool = False) -> None:
        # No checksums answered: SGLang has none per adapter (verified by the adapter's name listed).
        loaded = self._loras(await self.transport.request("GET", "/v1/models"))
        if name in loaded:  # SGLang refuses a name already loaded: a swap is unload, then load
            await self.unload_lora(name)
        await self._post(
            "/load_lora_adapter",
            {"lora_name": name, "lora_path": path},
            timeout_s=self.deadlines.weight_load_s,
            retry=False,
        )

    async def unload_lora(self, name: str) -> None:
        try:
            await self._post("/unload_lora_adapter", {"lora_name": name})
        except WorkerRejected as exc:
            if "not loaded" not in str(exc) and "not found" not in str(exc).lower():
                raise  # an adapter SGLang does not hold: already unloaded, so idempotent success

    async def sleep(self, level: int, mode: SleepMode, timeout_s: float) -> None:
        # SGLang releases memory only with generation paused; level 2 (discard) has no SGLang
        # meaning apart from level 1: it releases the weights' and KV's memory either way.
        await self.pause(mode, timeout_s)
        self._asleep = True
        await self._post("/release_memory_occupation", {}, timeout_s=timeout_s + self.deadlines.grace_s)

    async def wake_up(self, tags: list[str] | None) -> None:
        await self._post(
            "/resume_memory_occupation", {"tags": tags} if tags else {}, timeout_s=self.deadlines.weight_load_s
        )
        if not tags or {"weights", "kv_cache"} <= set(tags):
            self._asleep = False  # still paused: the controller resumes a woken member once verified

    async def reset_prefix_cache(self, *, running: bool, external: bool) -> None:
        # 400 while requests run, unless SGLang is given time to wait for them (`timeout`).
        params = {"timeout": str(self.deadlines.weight_load_s)} if running else None
        await self.transport.request(
            "POST", "/flush_cache", params=params, timeout_s=self.deadlines.weight_load_s + self.deadlines.grace_s
        )

    # -- helpers ------------------------------------------------------------------------
    async def _drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            counts = _counts(await self.transport.request("GET", "/v1/loads", retry=False), self.spec.id)
            if counts.running == 0 and counts.waiting == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_DRAIN_POLL_S)

    async def _post(
        self, path: str, body: dict[str, Any], *, timeout_s: float | None = None, retry: bool = True
    ) -> Any:
        answer = await self.transport.request("POST", path, json_body=body, timeout_s=timeout_s, retry=retry)
        if isinstance(answer, dict) and answer.get("success") is False:  # SGLang's refusals say so in the body
            raise WorkerRejected(self.spec.id, f"POST {path}: {answer.get('message') or 'success=false'}", status=200)
        return answer

    def _loras(self, body: Any) -> dict[str, str | None]:
        # SGLang lists each adapter as a card whose parent is the base model; it keeps no versions.
        cards = self.answer_field(body, "data", "GET /v1/models")
        return {str(card["id"]): None for card in cards if isinstance(card, dict) and card.get("parent")}


def _counts(body: Any, worker_id: str) -> RequestCounts:
    """Running and waiting requests over SGLang's data-parallel ranks (`GET /v1/loads`)."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list):
        raise WorkerRejected(worker_id, "GET /v1/loads answered without 'loads'", status=200)
    return RequestCounts(
        running=sum(int(r.get("num_running_reqs") or 0) for r in loads if isinstance(r, dict)),
        waiting=sum(int(r.get("num_waiting_reqs") or 0) for r in loads if isinstance(r, dict)),
    )

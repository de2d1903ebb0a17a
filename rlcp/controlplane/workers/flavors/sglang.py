"""The `sglang` flavor: SGLang's own server (`python -m sglang.launch_server`), as slime, Miles,
AReaL, SkyRL and verl's SGLang rollouts run it. Contracts read from SGLang 0.5.23's
`srt/entrypoints/http_server.py` and `srt/managers/io_struct.py`, and checked against the running
server in tests/controlplane/workers/flavors/sglang/.

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
  versions travel with the loads; the driver calls it only to name broadcast weights after a finish
  that named none, and then with `abort_all_requests: false`.
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
  answer to the version the fence chose (`workerspec.FLAVOR_REQUESTS`).
- broadcast: vLLM's weight-transfer calls (the controller's API) translated onto SGLang's group:
    init   -> `POST /init_weights_update_group {master_address, master_port, world_size, rank_offset,
              group_name, backend}`: the rank offset the controller gave this member; `backend` and
              `group_name` from the trainer's `init_info` (defaults SGLang's: `nccl`,
              `weight_update_group`), the group name then kept by the driver for every later call.
              A group of that name left from an earlier trainer is destroyed first (SGLang refuses a
              second one). SGLang's join has no deadline of its own (torch's default, 30 minutes)
              and blocks its scheduler meanwhile, so the driver first waits, within the init's
              deadline, until the trainer's rendezvous port accepts a connection; a trainer that
              never listens fails the init without SGLang being asked. `init_info` keys SGLang's
              group does not take (vLLM backends' `buffer_size_bytes`, `packed`, ...) are refused
              by the controller, 422 naming the key, before any worker is called
              (`init_info_problem`): such a trainer speaks vLLM's wire;
    start  -> `POST /begin_weight_update` (a session left open by an earlier controller is ended
              first: SGLang refuses a second one);
    chunk  -> `POST /update_weights_from_distributed {names, dtypes (vLLM's dtype_names), shapes,
              group_name, flush_cache: false}`, one per chunk, only inside begin/end as SGLang
              requires. SGLang receives each named tensor as one broadcast from rank 0, in order,
              in its declared dtype, and loads it at once;
    finish -> one more `update_weights_from_distributed` naming no tensor, with `flush_cache: true`
              and the finish's `weight_version`: the version declared and the radix cache flushed
              in the scheduler step that records the load (not a separate `/update_weight_version`,
              which would leave a window with new weights under the old name), then `POST
              /end_weight_update`. The operation
              verifies by the version `/model_info` then reports. A finish without a version
              after chunks (or a chunk that failed: the operation calls no finish on that worker,
              so the driver ends the session itself) declares `UNNAMED_WEIGHTS`, which the status
              reports as no version: SGLang keeps whatever part of the chunk loaded, and the old
              version no longer describes it, so the reconciler reloads the disk copy (or the
              member stays out until the next broadcast) instead of resuming it as converged;
    naming -> `/update_weight_version {new_version, abort_all_requests: false}` (after a finish that
              named none); shutdown -> `/destroy_weights_update_group {group_name}`.
  The trainer is rank 0 of SGLang's kind of group (`sglang.srt.utils.init_custom_process_group`;
  slime's trainer uses a copy of it, `slime.utils.distributed_utils.init_process_group`) and
  broadcasts each tensor alone; vLLM's trainer-side engines cannot be
  (`capabilities.require_one_transfer_wire`): a fleet that mixes SGLang members with vLLM-wire
  members is refused a broadcast up front with a 409 saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, final

from rlcp.controlplane.workers.capabilities import (
    BroadcastPeer,
    Control,
    DiskWeights,
    LoadReport,
    Lora,
    PrefixCache,
    Sleep,
    SleepMode,
    TransferWire,
)
from rlcp.controlplane.workers.flavors.base import AdapterVersions, SeparateUpdateCalls
from rlcp.controlplane.workers.transport import WorkerCallError, WorkerRejected
from rlcp.controlplane.workers.updates import DeclaredUpdate
from rlcp.controlplane.workerspec import WorkerStatus
from rlcp.core.wire.agent import PauseMode, RequestCounts

# Ours -> SGLang's (see the module docstring); `wait` drains first, then pauses so.
_SGLANG_MODE: dict[PauseMode, str] = {"abort": "abort", "keep": "retract", "wait": "retract"}
_DRAIN_POLL_S = 0.2
# SGLang's defaults for a group (`InitWeightsUpdateGroupReqInput`), and the keys its group takes.
_GROUP_DEFAULTS = {"group_name": "weight_update_group", "backend": "nccl"}
_GROUP_KEYS = frozenset({"master_address", "master_port", "world_size", "rank_offset", *_GROUP_DEFAULTS})
_CHUNK_KEYS = frozenset({"names", "dtype_names", "shapes"})
_RENDEZVOUS_POLL_S = 0.2
# Declared when a broadcast changed weights without naming them (a failed or unnamed update): the
# old version no longer describes them. A space: no version a client can name (`VERSION_PATTERN`).
UNNAMED_WEIGHTS = "unnamed weights (rlcp)"


@final
class SglangDriver(
    AdapterVersions, SeparateUpdateCalls, Control, DeclaredUpdate, DiskWeights, Lora, Sleep, PrefixCache, BroadcastPeer
):
    """Speaks to one SGLang server (its HTTP port is both its admin and its inference URL)."""

    flavor = "sglang"
    partial_wake = True
    _paused = False  # SGLang has no read of its pause: what this driver's calls left it in
    _asleep = False  # likewise for memory occupation
    _served_name: str | None = None  # the name it served before a disk update renamed it
    transfer_wire: TransferWire = "sglang"
    _group: str | None = None  # the weight-update group this driver had the server join
    _session = False  # between this driver's begin_weight_update and end_weight_update
    _changed = False  # a chunk was sent in this session: the weights may differ from the version's

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
            weight_version=None if version is None or version == UNNAMED_WEIGHTS else str(version),
            requests=_counts(loads, self.spec.id),
            loras=self.listed_adapters(models),
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
        loaded = self.listed_adapters(await self.transport.request("GET", "/v1/models"))
        if name in loaded:  # SGLang refuses a name already loaded: a swap is unload, then load
            await self.unload_lora(name)
        await self._post(
            "/load_lora_adapter",
            {"lora_name": name, "lora_path": path},
            timeout_s=self.deadlines.weight_load_s,
            retry=False,
        )
        self.adapter_loaded(name, path, version)

    async def unload_lora(self, name: str) -> None:
        try:
            await self._post("/unload_lora_adapter", {"lora_name": name})
        except WorkerRejected as exc:
            if "not loaded" not in str(exc) and "not found" not in str(exc).lower():
                raise  # an adapter SGLang does not hold: already unloaded, so idempotent success
        self.adapter_unloaded(name)

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

    # -- broadcast: vLLM's calls onto SGLang's group (see the module docstring) ---------------
    async def init_weight_transfer(self, init_info: dict[str, Any], timeout_s: float) -> None:
        body = self._group_body(init_info)
        deadline = time.monotonic() + timeout_s
        await self._destroy_group(body["group_name"])  # SGLang refuses a second group of one name
        self._group = None
        await self._await_rendezvous(str(body["master_address"]), int(body["master_port"]), deadline)
        await self._post(
            "/init_weights_update_group",
            body,
            timeout_s=max(deadline - time.monotonic(), 0.0) + self.deadlines.grace_s,
            retry=False,
        )
        self._group = str(body["group_name"])

    async def start_weight_update(self) -> None:
        try:
            await self._post("/begin_weight_update", {}, retry=False)
        except WorkerRejected as exc:
            if "already open" not in str(exc):
                raise
            # A session an earlier controller (or a failed update) left open: end it, begin again.
            await self._post("/end_weight_update", {}, retry=False)
            await self._post("/begin_weight_update", {}, retry=False)
        self._session, self._changed = True, False

    async def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]], timeout_s: float) -> None:
        group = self._require_group()
        try:
            for chunk in update_info if isinstance(update_info, list) else [update_info]:
                body = self._chunk_body(chunk, group)
                self._changed = True  # from here SGLang may have loaded part of it
                await self._post(
                    "/update_weights_from_distributed",
                    body,
                    timeout_s=timeout_s + self.deadlines.grace_s,
                    retry=False,
                )
        except WorkerCallError:
            # The operation calls no finish on a worker whose chunk failed: end the session here,
            # the cache flushed and, if anything may have loaded, the old version withdrawn
            # (SGLang keeps what loaded: "the full weights are partially updated").
            with contextlib.suppress(WorkerCallError):
                await self.finish_weight_update(None)
            raise

    async def finish_weight_update(self, version: str | None) -> None:
        if not self._session:
            return  # nothing begun here: nothing loaded to flush or to name
        # A load of no tensor: the version declared and the cache flushed in the scheduler step
        # that records a load, inside the session as SGLang requires. Without a version, weights
        # a chunk changed are no longer reported under the old one.
        named = version if version is not None else UNNAMED_WEIGHTS if self._changed else None
        await self._post(
            "/update_weights_from_distributed",
            {
                "names": [],
                "dtypes": [],
                "shapes": [],
                "group_name": self._group or _GROUP_DEFAULTS["group_name"],
                "flush_cache": True,
                "weight_version": named,
                "abort_all_requests": False,
            },
            timeout_s=self.deadlines.weight_load_s,
            retry=False,
        )
        await self._post("/end_weight_update", {}, retry=False)
        self._session = self._changed = False

    async def shutdown_weight_transfer(self) -> None:
        if self._group is not None:
            await self._destroy_group(self._group)
            self._group = None

    async def update_weight_version(self, version: str) -> None:
        # Never SGLang's default (`abort_all_requests: true` aborts everything in flight).
        await self._post("/update_weight_version", {"new_version": version, "abort_all_requests": False})

    def init_info_problem(self, init_info: dict[str, Any]) -> tuple[str, str] | None:
        # The controller sets rank_offset itself (the worker's place in the group).
        return group_problem(init_info | {"rank_offset": 1})

    def update_info_problem(self, chunk: dict[str, Any]) -> tuple[str, str] | None:
        return chunk_problem(chunk)

    def _group_body(self, init_info: dict[str, Any]) -> dict[str, Any]:
        if (problem := group_problem(init_info)) is not None:
            raise WorkerRejected(self.spec.id, problem[1])
        return _GROUP_DEFAULTS | dict(init_info)

    def _chunk_body(self, chunk: dict[str, Any], group: str) -> dict[str, Any]:
        if (problem := chunk_problem(chunk)) is not None:
            raise WorkerRejected(self.spec.id, problem[1])
        return {
            "names": chunk["names"],
            "dtypes": chunk["dtype_names"],
            "shapes": chunk["shapes"],
            "group_name": group,
            "flush_cache": False,  # once, at finish: the engine is paused meanwhile
            "abort_all_requests": False,
        }

    def _require_group(self) -> str:
        if self._group is None:
            raise WorkerRejected(self.spec.id, "no weight-update group joined: initialise the weight transfer first")
        return self._group

    async def _destroy_group(self, name: str) -> None:
        # Leaving a group twice is harmless: a refusal ("does not exist") is success here; an
        # unreachable server or a timeout is not, and fails the call.
        with contextlib.suppress(WorkerRejected):
            await self._post("/destroy_weights_update_group", {"group_name": name}, retry=False)

    async def _await_rendezvous(self, host: str, port: int, deadline: float) -> None:
        """Until `deadline`, wait for the trainer's rendezvous (rank 0's TCP store) to accept a
        connection: SGLang's own join would wait 30 minutes for it, its scheduler blocked."""
        while True:
            left = deadline - time.monotonic()
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), max(left, 0.05))
            except (OSError, TimeoutError):
                if time.monotonic() + _RENDEZVOUS_POLL_S >= deadline:
                    raise WorkerRejected(
                        self.spec.id,
                        f"the trainer's rendezvous at {host}:{port} did not accept a connection in time; "
                        "SGLang was not asked to join (its join would block its scheduler for 30 minutes)",
                    ) from None
                await asyncio.sleep(_RENDEZVOUS_POLL_S)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

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


def group_problem(init_info: dict[str, Any]) -> tuple[str, str] | None:
    """(the key, why) if SGLang's `/init_weights_update_group` cannot take `init_info`."""
    if unknown := sorted(set(init_info) - _GROUP_KEYS):
        return unknown[0], (
            f"init_info keys SGLang's weight-update group does not take: {', '.join(unknown)} "
            "(a trainer on vLLM's weight-transfer wire?); it takes master_address, master_port, "
            "world_size, backend and group_name"
        )
    body = _GROUP_DEFAULTS | dict(init_info)
    kinds = {"master_address": str, "master_port": int, "world_size": int, "rank_offset": int}
    kinds |= dict.fromkeys(_GROUP_DEFAULTS, str)
    if wrong := sorted(k for k, kind in kinds.items() if not _is(body.get(k), kind)):
        return wrong[0], f"init_info for SGLang's group: {', '.join(wrong)} missing or mistyped"
    return None


def chunk_problem(chunk: dict[str, Any]) -> tuple[str, str] | None:
    """(the key, why) if an update chunk is not one SGLang's `/update_weights_from_distributed` takes."""
    if sorted(chunk) != sorted(_CHUNK_KEYS):
        odd = sorted(set(chunk) ^ _CHUNK_KEYS)
        return odd[0] if odd else "", (
            "an update chunk for SGLang names names, dtype_names and shapes only; got "
            f"{', '.join(sorted(chunk))} (SGLang receives each tensor alone: no packed buffers)"
        )
    return None


def _is(value: Any, kind: type) -> bool:
    """A JSON value of that kind (a bool is no int here), a string not empty."""
    return isinstance(value, kind) and not isinstance(value, bool) and value != ""


def _counts(body: Any, worker_id: str) -> RequestCounts:
    """Running and waiting requests over SGLang's data-parallel ranks (`GET /v1/loads`)."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list):
        raise WorkerRejected(worker_id, "GET /v1/loads answered without 'loads'", status=200)
    return RequestCounts(
        running=sum(int(r.get("num_running_reqs") or 0) for r in loads if isinstance(r, dict)),
        waiting=sum(int(r.get("num_waiting_reqs") or 0) for r in loads if isinstance(r, dict)),
    )

"""Operations and reconciliation without sockets: the controller's real operations, drivers,
fan-out and reconciler against real agents (service and route handlers on SimEngine),
connected by `MemoryTransport` (rlcp/harness/memory.py). The wire itself is covered by the
socket tests (test_controller_sim.py, test_adminapi_flavors.py); these pin down the logic,
fast. One test comes in through the controller's own HTTP route (aiohttp's test client) to
SGLang doubles behind `MemoryTransport`: a chunk's 422 is made on that path, not in a helper."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, get_args

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.errors import to_api_error
from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.errors import InvalidInput, MissingCapability, PathOutsideRoots
from rlcp.controlplane.metrics import STEPS, failed_step
from rlcp.controlplane.operations.broadcast import plan_ranks
from rlcp.controlplane.operations.lora import load_lora
from rlcp.controlplane.operations.pause import pause, resume
from rlcp.controlplane.operations.weights import update_weights
from rlcp.controlplane.reconcile.plan import ActionKind
from rlcp.controlplane.reconcile.ratelimit import WorkerRateLimiter
from rlcp.controlplane.workers.capabilities import CHECKSUMS
from rlcp.controlplane.workers.transport import CallPolicy, MemoryTransport, WorkerTransport
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.wire.agent.checksums import EMPTY_TENSOR_SHA256
from rlcp.core.wire.controller import (
    LoraRequest,
    PauseRequest,
    TransferInitRequest,
    TransferUpdateRequest,
    UpdateWeightsRequest,
)
from rlcp.harness.checkpoints import write_adapter, write_checkpoint
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings, disk_update
from rlcp.harness.faults import Fault
from rlcp.harness.memory import MemoryFleet

pytestmark = pytest.mark.timeout(60)


async def test_an_update_reaches_every_worker_and_is_verified(memory_fleet: MemoryFleet, tmp_path: Path) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    assert result.status == "ok" and {r.phase for r in result.results} == {"resume"}
    assert all(a.service.weight_version == "v1" and not a.service.paused for a in memory_fleet.agents.values())
    state = ctl.state()
    assert state.applied.weight_version == "v1" and state.applied.converged and state.applied.verified
    assert state.phase == "serving" and ctl.desired.state.checkpoint is not None
    again = await update_weights(ctl, disk_update(tmp_path, "v1", 1))  # the same version again: a no-op
    assert again.status == "ok" and again.detail.get("noop") is True


async def test_an_agent_takes_a_check_and_one_call_per_update_and_a_wrong_load_still_fails_verification(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    for a in memory_fleet.agents.values():
        a.calls.clear()
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    assert result.status == "ok"
    # The checkpoint checked before anyone pauses (headers only), then one call that does the
    # rest (desired version, pause, load, checksums, resume) and answers the state, so no final
    # read: the floor of two round trips (issue 35), as the agents saw them.
    assert all(
        a.calls == ["POST /v1/agent/weights/check", "POST /v1/agent/weights/update"]
        for a in memory_fleet.agents.values()
    ), {a.agent_id: a.calls for a in memory_fleet.agents.values()}
    view = {w.id: w for w in ctl.state().workers}
    assert all(w.ready and w.serving and w.weight_version == "v1" for w in view.values())
    assert ctl.state().applied.verified and all(
        a.service.desired_weight_version == "v1" for a in memory_fleet.agents.values()
    )
    # The checksums the loads answered are still compared across workers: w2 reading other
    # files at the same path (a stale node-local copy) is the minority that fails verification.
    wrong = write_checkpoint(tmp_path / "v2-stale-copy", 3)
    real_load = memory_fleet["w2"].engine.load_weights_from_disk
    memory_fleet["w2"].engine.load_weights_from_disk = lambda path: real_load(wrong)  # type: ignore[method-assign]
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2))
    assert result.status == "partial"
    failed = {r.worker_id: r for r in result.results if r.status != "ok"}
    assert list(failed) == ["w2"] and failed["w2"].phase == "verify", result.results
    assert "checksums differ from 2 other worker(s)" in (failed["w2"].message or "")
    # It resumed in its call (nothing to hold it to yet in a first wave), was cordoned all along,
    # and is paused again: out of the fence.
    assert memory_fleet["w2"].service.paused and not memory_fleet["w0"].service.paused
    assert not {w.id: w for w in ctl.state().workers}["w2"].serving
    assert memory_fleet["w2"].calls[-3:] == [
        "POST /v1/agent/weights/check",
        "POST /v1/agent/weights/update",
        "POST /pause",
    ]


async def test_a_checksum_of_no_bytes_is_not_compared_and_a_differing_tensor_is_named(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    """A tensor hashed as no bytes (a stock vLLM CPU server's repacked linear layers) is left out of
    the comparison for every worker and reported, not counted as agreement; a worker whose other
    tensors differ is told which."""
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    held: dict[str, dict[str, str]] = {
        "w0": {"layer.weight": EMPTY_TENSOR_SHA256},
        "w1": {"layer.weight": EMPTY_TENSOR_SHA256},
        "w2": {"layer.weight": "a" * 64},
    }  # its kernel's weight, read back
    for worker_id, extra in held.items():
        engine = memory_fleet[worker_id].engine

        async def sums(real=engine.weight_checksums, extra=extra) -> dict[str, str]:
            return await real() | extra

        engine.weight_checksums = sums  # type: ignore[method-assign]
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    assert result.status == "ok", result.results
    assert result.detail["checksums_not_compared"]["tensors"] == ["layer.weight"]

    held["w1"]["other.weight"] = "b" * 64  # w1 alone holds a tensor the others do not
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2))
    failed = {r.worker_id: r for r in result.results if r.status != "ok"}
    assert list(failed) == ["w1"], result.results
    assert (failed["w1"].message or "").endswith(
        "differ from 2 other worker(s) at version 'v2': 1 tensor(s) differ (other.weight)"
    )


async def test_a_failed_load_leaves_that_worker_paused_and_the_reconciler_converges_it(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    memory_fleet["w1"].engine.fail_next("load_weights_from_disk")  # once; the reconciler's retry fails at the wire
    memory_fleet["w1"].faults.add("POST", "/v1/agent/weights/disk", Fault("status", 500))
    result = await update_weights(ctl, disk_update(tmp_path, "v2", 2))
    assert result.status == "partial"
    failed = {r.worker_id: r for r in result.results if r.status != "ok"}
    assert list(failed) == ["w1"] and failed["w1"].phase == "update" and "injected" in (failed["w1"].message or "")
    assert (
        memory_fleet["w1"].service.paused
        and not memory_fleet["w0"].service.paused
        and not memory_fleet["w2"].service.paused
    )
    view = {w.id: w for w in ctl.state().workers}
    assert not view["w1"].ready and not view["w1"].serving and view["w0"].serving
    # Still failing: the reconciler tries, fails, and backs off (no tight loop). The backoff's clock
    # is the test's: "inside the backoff" is certain, not a race with its 0.05 s on a loaded machine.
    now = [0.0]
    ctl.reconciler.limiter = WorkerRateLimiter(initial_s=0.05, max_s=0.2, clock=lambda: now[0])
    assert await ctl.reconciler.reconcile_once() == 1
    assert ctl.reconciler.limiter.num_requeues("w1") == 1 and not ctl.reconciler.limiter.due("w1")
    assert await ctl.reconciler.reconcile_once() == 0  # inside its backoff: left alone
    memory_fleet["w1"].faults.clear()
    now[0] += 1.0  # past the backoff (0.2 s at most)
    assert ctl.reconciler.limiter.due("w1")
    assert await ctl.reconciler.reconcile_once() == 1
    assert memory_fleet["w1"].service.weight_version == "v2" and not memory_fleet["w1"].service.paused
    assert ctl.reconciler.limiter.num_requeues("w1") == 0
    assert ctl.state().applied.converged


async def test_a_hung_pause_costs_its_deadline_and_names_the_worker(memory_fleet: MemoryFleet, tmp_path: Path) -> None:
    ctl = memory_fleet.controller(
        tmp_path, workers={"timeout_s": 0.2, "attempts": 1, "pause_timeout_s": 0.3, "deadline_grace_s": 1}
    )
    memory_fleet["w2"].faults["/pause"] = Fault("hang")
    result = await pause(ctl, PauseRequest(mode="keep", timeout_s=0.3))
    timed_out = [r for r in result.results if r.status == "timeout"]
    assert [r.worker_id for r in timed_out] == ["w2"] and result.status == "partial"
    assert ctl.desired.state.paused and memory_fleet["w0"].service.paused
    memory_fleet["w2"].faults.clear()
    assert (await resume(ctl)).status == "ok" and not ctl.desired.state.paused


async def test_refused_input_touches_no_worker(memory_fleet: MemoryFleet, tmp_path: Path) -> None:
    ctl = memory_fleet.controller(tmp_path)
    with pytest.raises(PathOutsideRoots) as refused:
        await update_weights(ctl, UpdateWeightsRequest(version="v9", source={"kind": "disk", "path": "/etc"}))
    assert to_api_error(refused.value).status == 403 and refused.value.field == "source.path"
    with pytest.raises(PathOutsideRoots):
        await load_lora(ctl, LoraRequest(name="a", path="/tmp/../etc"))
    assert all(a.touched == [] for a in memory_fleet.agents.values())
    write_adapter(tmp_path / "lora")
    assert (await load_lora(ctl, LoraRequest(name="a", path=str(tmp_path / "lora")))).status == "ok"


async def test_an_operation_a_member_cannot_do_is_refused_up_front_naming_it(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    # w2 is driven as a Dynamo worker: no broadcast weight transfer.
    ctl.apply_membership([*memory_fleet.specs()[:2], WorkerSpec(id="w2", admin_url="memory://w2", flavor="dynamo")])
    with pytest.raises(MissingCapability) as refused:
        await ctl.transfer.init(TransferInitRequest(init_info={"world_size": 4}))
    assert refused.value.workers == {"w2": "broadcast"} and "w2 (dynamo)" in refused.value.message
    answer = to_api_error(refused.value)
    assert answer.status == 409 and answer.body()["error"]["workers"] == {"w2": "broadcast"}
    assert all(a.touched == [] for a in memory_fleet.agents.values()) and ctl.log.last is None


async def test_a_broadcast_over_agents_and_sglang_members_is_refused_up_front_saying_why(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    """SGLang members can broadcast, agents can: not in one group (their wires differ)."""
    ctl = memory_fleet.controller(tmp_path)
    # w2 is driven as an SGLang server (its memory:// address answers nothing: it must not be called).
    ctl.apply_membership([*memory_fleet.specs()[:2], WorkerSpec(id="w2", admin_url="memory://w2", flavor="sglang")])
    with pytest.raises(MissingCapability) as refused:
        await ctl.transfer.init(TransferInitRequest(init_info={"world_size": 4}))
    assert list(refused.value.workers) == ["w2"]
    assert "cannot mix SGLang members (w2) with members on vLLM's weight-transfer wire (w0, w1)" in (
        refused.value.message
    )
    assert to_api_error(refused.value).status == 409
    assert all(a.touched == [] for a in memory_fleet.agents.values()) and ctl.log.last is None


async def test_a_broadcast_init_sglang_cannot_take_is_a_422_naming_the_key_before_any_call(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    """An SGLang-only fleet: keys its group does not take (a trainer on vLLM's wire) are refused by
    the controller, naming the field, with no worker called (a chunk: the test below)."""
    ctl = memory_fleet.controller(tmp_path)
    # Driven as SGLang servers; behind them the memory fleet's agents note any call that reaches them.
    ctl.apply_membership([WorkerSpec(id=f"w{i}", admin_url=f"memory://w{i}", flavor="sglang") for i in range(2)])
    good = {"master_address": "127.0.0.1", "master_port": 29500, "world_size": 3}
    for init_info, field in (
        (good | {"buffer_size_bytes": 64}, "init_info.buffer_size_bytes"),
        (good | {"master_port": "x"}, "init_info.master_port"),
        ({"master_address": "127.0.0.1", "master_port": 29500}, "init_info.world_size"),
    ):
        with pytest.raises(InvalidInput) as refused:
            await ctl.transfer.init(TransferInitRequest(init_info=init_info))
        error = to_api_error(refused.value)
        assert (error.status, refused.value.field) == (422, field), refused.value.message
        assert refused.value.message.startswith("w0: ")  # the member whose group refused it
    assert all(a.touched == [] for a in memory_fleet.agents.values()) and ctl.log.last is None


class _SglangDouble:
    """SGLang's weight-update routes as its server answers them (`{"success": true}`), noting every
    call: behind the `sglang` driver through `MemoryTransport`. What the driver sends and how the
    real server answers are checked in tests/controlplane/workers/flavors/ (test_sglang_flavor.py, the wire;
    sglang/, the server)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.version: str | None = None

    async def handle(self, method: str, path: str, params: dict[str, str], body: Any) -> tuple[int, Any]:
        self.calls.append(f"{method} {path}")
        if method == "GET":
            reads = {
                "/model_info": {"weight_version": self.version, "served_model_name": "tiny", "model_path": "/m"},
                "/v1/loads": {"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]},
                "/v1/models": {"data": [{"id": "tiny", "parent": None}]},
            }
            return (200, reads[path]) if path in reads else (404, {"detail": "Not Found"})
        if path == "/update_weights_from_distributed" and body["names"] == [] and body.get("weight_version"):
            self.version = body["weight_version"]  # the finish: a load of no tensor naming the weights
        return 200, {"success": True, "message": "ok"}


async def test_a_broadcast_chunk_sglang_cannot_take_is_a_422_naming_the_key_and_the_update_stays_open(
    tmp_path: Path,
) -> None:
    """Through the controller's route, on an SGLang-only fleet: a chunk with a key SGLang's
    `/update_weights_from_distributed` does not take (vLLM's packed buffers) is refused before
    any worker is sent it; the open update goes on with the next chunk and finishes."""
    doubles = {f"w{i}": _SglangDouble() for i in range(2)}
    specs = [WorkerSpec(id=w, admin_url=f"http://{w}:30000", flavor="sglang") for w in doubles]
    settings = controller_settings(tmp_path, [], gateway={"enabled": False}, store={"kind": "memory"})

    def transports(spec: WorkerSpec, policy: CallPolicy) -> WorkerTransport:
        return MemoryTransport(worker_id=spec.id, handler=doubles[spec.id].handle, policy=policy)

    # The trainer's rendezvous (rank 0's store): the driver waits for it to listen before the join.
    rendezvous = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = rendezvous.sockets[0].getsockname()[1]
    app = assemble(settings, token=CTL_TOKEN, transports=transports, background=False, gateway=False)
    async with TestClient(TestServer(app)) as client, rendezvous:
        app[CONTROLLER].apply_membership(specs)

        async def post(path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
            resp = await client.post(path, json=body, headers=AUTH)
            return resp.status, await resp.json()

        init_info = {"master_address": "127.0.0.1", "master_port": port, "world_size": 3, "backend": "gloo"}
        assert (await post("/v1/rl/weight_transfer/init", {"init_info": init_info}))[0] == 200
        assert (await post("/v1/rl/weight_transfer/start"))[0] == 200
        sent = {w: len(d.calls) for w, d in doubles.items()}
        chunk = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}

        status, body = await post("/v1/rl/weight_transfer/update", {"update_info": chunk | {"packed": True}})
        assert (status, body.get("error", {}).get("field")) == (422, "update_info.packed"), body
        assert body["error"]["message"].startswith("w0: ")  # the member whose group refused it
        assert {w: len(d.calls) for w, d in doubles.items()} == sent  # nothing sent to any worker
        # A list of chunks is checked whole: one bad chunk refuses it before the good one is sent.
        status, body = await post("/v1/rl/weight_transfer/update", {"update_info": [chunk, {"names": ["w"]}]})
        assert (status, body.get("error", {}).get("field")) == (422, "update_info.dtype_names"), body
        assert {w: len(d.calls) for w, d in doubles.items()} == sent

        assert (await post("/v1/rl/weight_transfer/update", {"update_info": chunk}))[0] == 200
        assert all(d.calls[sent[w] :] == ["POST /update_weights_from_distributed"] for w, d in doubles.items())
        status, body = await post("/v1/rl/weight_transfer/finish", {"weight_version": "v1"})
        assert (status, body["status"]) == (200, "ok"), body
        after = ["POST /update_weights_from_distributed", "POST /end_weight_update", "POST /continue_generation"]
        assert all(
            d.version == "v1" and [c for c in d.calls[sent[w] + 1 :] if c.startswith("POST")] == after
            for w, d in doubles.items()
        )


async def test_failures_are_counted_by_step_from_a_closed_set_never_by_chunk(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    assert (await ctl.transfer.init(TransferInitRequest(init_info={"world_size": 4}))).status == "ok"
    assert (await ctl.transfer.start()).status == "running"
    chunk = TransferUpdateRequest(update_info={"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]})
    for _ in range(3):
        await ctl.transfer.update_chunk(chunk)
    memory_fleet["w1"].faults["/update_weights"] = Fault("status", 500)
    result = await ctl.transfer.update_chunk(chunk)
    # The record says which chunk; the metric's label names only the step.
    assert {r.worker_id: r.phase for r in result.results if r.status == "error"} == {"w1": "update_weights[4]"}
    labels = {
        sample.labels["phase"]
        for metric in ctl.metrics.registry.collect()
        if metric.name == "rlcp_worker_failures"
        for sample in metric.samples
    }
    assert labels == {"update_weights"} and labels <= STEPS
    # A result's phase text maps into the same set (the reconciler's `reconcile:<action>` included).
    assert {f"reconcile:{kind}" for kind in get_args(ActionKind)} <= STEPS
    assert [failed_step(p) for p in ("update_weights[12]", "reconcile:pause", "abort:finish_weight_update")] == [
        "update_weights",
        "reconcile:pause",
        "other",
    ]


async def test_a_step_sends_nothing_to_a_member_whose_flavor_lacks_its_capability(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    # w2 joins as a Dynamo worker after an operation checked its members: no checksums to ask for.
    ctl.apply_membership([*memory_fleet.specs()[:2], WorkerSpec(id="w2", admin_url="memory://w2", flavor="dynamo")])
    outcomes = await ctl.fanout.each(
        [r.driver for r in ctl.members()], CHECKSUMS, lambda w: w.weight_checksums(), phase="verify", deadline_s=5
    )
    assert {o.worker_id: (o.result.status, o.result.code) for o in outcomes} == {
        "w0": ("ok", None),
        "w1": ("ok", None),
        "w2": ("error", "capability_missing"),
    }
    assert "w2 (dynamo) lacks the 'checksums' capability" in (outcomes[-1].result.message or "")
    assert memory_fleet["w2"].calls == []


def test_ranks_follow_world_sizes_in_id_order() -> None:
    assert plan_ranks({"b": 2, "a": 1, "c": 1}) == [("a", 1, 1), ("b", 2, 2), ("c", 4, 1)]


def test_the_rate_limiter_grows_caps_and_forgets() -> None:
    now = [100.0]
    limiter = WorkerRateLimiter(initial_s=1.0, max_s=4.0, clock=lambda: now[0], jitter=lambda: 1.0)
    assert limiter.due("w") and [limiter.when("w") for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert not limiter.due("w") and limiter.num_requeues("w") == 4
    now[0] += 4.0
    assert limiter.due("w")
    limiter.forget("w")
    assert limiter.when("w") == 1.0


async def test_an_adapter_load_is_verified_and_a_stale_copy_is_named(memory_fleet: MemoryFleet, tmp_path: Path) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    adapter = write_adapter(tmp_path / "ad")
    (adapter / "adapter_model.safetensors").write_bytes(b"the adapter the trainer wrote")
    stale = write_adapter(tmp_path / "stale")
    (stale / "adapter_model.safetensors").write_bytes(b"last week's adapter, same name")
    # w1 reads another copy at the same path (a node-local cache that missed the new files).
    real_add = memory_fleet["w1"].engine.add_lora
    memory_fleet["w1"].engine.add_lora = lambda name, aid, path, replace: real_add(name, aid, stale, replace=replace)  # type: ignore[method-assign]
    for a in memory_fleet.agents.values():
        a.calls.clear()
    result = await load_lora(ctl, LoraRequest(name="ad", path=str(adapter)))
    assert result.status == "partial"
    failed = {r.worker_id: r for r in result.results if r.status != "ok"}
    assert list(failed) == ["w1"] and failed["w1"].phase == "verify"
    assert "adapter 'ad' checksums differ from 2 other worker(s)" in (failed["w1"].message or "")
    # The adapter checked before it is desired, then one call answering its checksums and the
    # state: two round trips per worker, as the agents saw them (issue 35).
    assert all(
        a.calls == ["POST /v1/agent/weights/check", "POST /v1/agent/loras"] for a in memory_fleet.agents.values()
    ), {a.agent_id: a.calls for a in memory_fleet.agents.values()}
    assert all(r.status.loras == {"ad": None} for r in ctl.members() if r.id != "w1")
    # Same bytes everywhere: verified; `verify: false` skips the checksums.
    memory_fleet["w1"].engine.add_lora = real_add  # type: ignore[method-assign]
    assert (await load_lora(ctl, LoraRequest(name="ad", path=str(adapter)))).status == "ok"
    for a in memory_fleet.agents.values():
        a.calls.clear()
    hashed = [a.engine.weight_checksums for a in memory_fleet.agents.values()]
    for a in memory_fleet.agents.values():

        async def refuse() -> dict[str, str]:
            raise AssertionError("hashed although verify is false")

        a.engine.weight_checksums = refuse  # type: ignore[method-assign]
    assert (await load_lora(ctl, LoraRequest(name="ad2", path=str(adapter), verify=False))).status == "ok"
    assert all(a.calls[-1] == "POST /v1/agent/loras" for a in memory_fleet.agents.values())
    for a, real in zip(memory_fleet.agents.values(), hashed, strict=True):
        a.engine.weight_checksums = real  # type: ignore[method-assign]


async def test_a_read_that_finds_nothing_new_changes_nothing_readers_see(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    generation, tag = ctl.changes.generation, ctl.state_etag()
    seen = {w.id: w.last_seen for w in ctl.state().workers}
    await ctl.refresh()  # the same statuses: only last_seen moves, and not in the document yet
    assert (ctl.changes.generation, ctl.state_etag()) == (generation, tag)
    assert all(r.last_seen != seen[r.id] for r in ctl.members())
    assert all(w.last_seen == seen[w.id] for w in ctl.state().workers)
    assert ctl.registry.publish_seen() == 3 and ctl.changes.generation == generation + 1  # all in one change
    assert all(w.last_seen != seen[w.id] for w in ctl.state().workers)

    memory_fleet["w1"].faults.add("GET", "/v1/agent/state", Fault("status", 500))
    await ctl.refresh()  # a new failure is a change ...
    failing = ctl.changes.generation
    assert failing > generation + 1 and not ctl.registry.get("w1").reachable
    await ctl.refresh()  # ... the same failure again is not
    assert ctl.changes.generation == failing
    memory_fleet["w1"].faults.clear()
    await ctl.refresh()
    assert ctl.changes.generation > failing and ctl.registry.get("w1").reachable


async def test_the_status_poll_skips_workers_an_update_just_heard_from(
    memory_fleet: MemoryFleet, tmp_path: Path
) -> None:
    from rlcp.controlplane.fleet.observer import observe_statuses

    ctl = memory_fleet.controller(tmp_path)
    await ctl.refresh()
    result = await update_weights(ctl, disk_update(tmp_path, "v1", 1))
    assert result.status == "ok"
    # the update's one call answered each agent's status: the state shows it, recorded as a read
    assert all(r.reported_at is not None and r.status.weight_version == "v1" for r in ctl.members())
    for a in memory_fleet.agents.values():
        a.calls.clear()
    await observe_statuses(registry=ctl.registry, fanout=ctl.fanout, interval_s=30, deadline_s=5, iterations=1)
    assert all(a.calls == [] for a in memory_fleet.agents.values()), "a worker heard from this interval was read again"
    for rec in ctl.members():
        rec.reported_at -= 31  # an interval later
    await observe_statuses(registry=ctl.registry, fanout=ctl.fanout, interval_s=30, deadline_s=5, iterations=1)
    assert all(a.calls == ["GET /v1/agent/state"] for a in memory_fleet.agents.values())

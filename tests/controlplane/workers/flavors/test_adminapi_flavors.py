"""The three worker drivers (flavors) on the wire: what each sends, how it reads the answers,
and how failures map onto the WorkerCallError taxonomy (retried or not).

aioresponses stands in for the workers; the session, HttpTransport and tenacity are real.
An unmocked request fails as a connection error, so a call a flavor should not make
shows up as a failure, not as silence.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from unittest.mock import Mock

import aiohttp
import pytest
from aioresponses import CallbackResult, aioresponses
from yarl import URL

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.settings import WorkerCallSettings
from rlcp.controlplane.workers.capabilities import LoadReport, UpdatePlan, capabilities
from rlcp.controlplane.workers.flavors.agent import AgentDriver
from rlcp.controlplane.workers.flavors.dynamo import DynamoDriver
from rlcp.controlplane.workers.flavors.sglang import UNNAMED_WEIGHTS
from rlcp.controlplane.workers.flavors.vllm import VllmDriver
from rlcp.controlplane.workers.registry import make_driver
from rlcp.controlplane.workers.transport import (
    CallPolicy,
    HttpTransport,
    WorkerRefused,
    WorkerRejected,
    WorkerTimeout,
    WorkerUnreachable,
)
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.wire.agent import RequestCounts
from rlcp.harness.http import free_port

BASE = "http://w0:8101"
POLICY = CallPolicy(timeout_s=0.5, attempts=3, backoff_initial_s=0.001, backoff_max_s=0.002)
GRACE_S = WorkerCallSettings().deadline_grace_s  # the default


class _Response(aiohttp.ClientResponse):
    """aioresponses 0.7.9 builds responses without the `stream_writer` aiohttp 3.14 requires
    (pnuckowski/aioresponses#289, fix pending in #288); aiohttp only reads its output_size."""

    def __init__(self, *args: Any, stream_writer: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, stream_writer=stream_writer or Mock(output_size=0), **kwargs)


class _Wire(aioresponses):
    def add(self, *args: Any, response_class: Any = None, **kwargs: Any) -> None:
        super().add(*args, response_class=response_class or _Response, **kwargs)


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def wire():
    with _Wire() as m:
        yield m


def make(flavor: str, session: aiohttp.ClientSession, **options: Any):
    spec = WorkerSpec(id="w0", admin_url=BASE, flavor=flavor)
    transport = HttpTransport(session=session, worker_id="w0", base_url=BASE, token="tok", policy=POLICY)
    return make_driver(
        spec, transport, DriverDeadlines(weight_load_s=options.get("weight_load_timeout_s", 600.0), grace_s=GRACE_S)
    )


def sent(m: aioresponses) -> list[tuple[str, str, Any]]:
    """(method, URL with query, JSON body) of every request, in order of first use of each URL."""
    return [
        (method, str(url), call.kwargs.get("json")) for (method, url), calls in m.requests.items() for call in calls
    ]


def slow(delay_s: float, payload: Any = None):
    async def callback(url, **kwargs):
        await asyncio.sleep(delay_s)
        return CallbackResult(payload=payload if payload is not None else {}, response_class=_Response)

    return callback


# -- factory -------------------------------------------------------------------------------
async def test_factory_picks_the_flavor_and_passes_options(session):
    assert isinstance(make("agent", session), AgentDriver)
    assert isinstance(make("vllm", session), VllmDriver)
    api = make("dynamo", session, weight_load_timeout_s=7.0)
    assert isinstance(api, DynamoDriver) and api.deadlines.weight_load_s == 7.0 and api.spec.id == "w0"


async def test_factory_names_the_available_flavors(session):
    spec = WorkerSpec(id="w0", admin_url=BASE).model_copy(update={"flavor": "tgi"})  # copy skips validation
    transport = HttpTransport(session=session, worker_id="w0", base_url=BASE, token=None, policy=POLICY)
    with pytest.raises(ValueError, match=r"'tgi'.*\['agent', 'dynamo', 'sglang', 'vllm'\]"):
        make_driver(spec, transport, DriverDeadlines(weight_load_s=600.0, grace_s=GRACE_S))


# -- agent ---------------------------------------------------------------------------------
AGENT_STATE = {
    "agent_id": "w0",
    "instance_id": "3f2a",
    "model": "tiny",
    "engine": "vllm",
    "engine_alive": True,
    "ready": False,
    "not_ready_reason": "weight version v1 differs from desired v2",
    "paused": True,
    "requests": {"running": 1, "waiting": 2, "frozen": 3},
    "weight_version": "v1",
    "desired_weight_version": "v2",
    "world_size": 2,
    "loras": [{"name": "sql", "version": "3", "path": "/m/sql", "adapter_id": 1, "loaded_at": "2025-01-01T00:00:00Z"}],
}


async def test_agent_status_reads_the_state_document(session, wire):
    wire.get(f"{BASE}/v1/agent/state", payload=AGENT_STATE)
    status = await make("agent", session).status()
    assert status.paused is True and status.weight_version == "v1" and status.world_size == 2
    assert status.requests == RequestCounts(running=1, waiting=2, frozen=3)
    assert status.loras == {"sql": "3"}
    assert status.ready is False and status.not_ready_reason.startswith("weight version v1")
    assert status.engine_alive is True and status.instance_id == "3f2a"
    (call,) = wire.requests[("GET", URL(f"{BASE}/v1/agent/state"))]
    assert call.kwargs["headers"] == {"Authorization": "Bearer tok"}


async def test_agent_malformed_state_is_rejected_without_retry(session, wire):
    wire.get(f"{BASE}/v1/agent/state", payload={"paused": "maybe"}, repeat=True)
    with pytest.raises(WorkerRejected) as err:
        await make("agent", session).status()
    assert err.value.status == 200 and "malformed state" in err.value.reason
    assert len(sent(wire)) == 1


async def test_agent_pause_sends_mode_and_timeout_and_waits_past_the_call_default(session, wire):
    # The answer comes after the policy's 0.5 s default: the pause deadline is timeout_s + grace.
    wire.post(f"{BASE}/pause?mode=keep&timeout_s=0.2", callback=slow(0.7, {"status": "paused"}))
    await make("agent", session).pause("keep", 0.2)
    assert sent(wire) == [("POST", f"{BASE}/pause?mode=keep&timeout_s=0.2", None)]


async def test_agent_mutations_send_the_documented_bodies(session, wire):
    for path in ("/resume", "/v1/agent/weights/disk", "/v1/agent/loras", "/weight_checker"):
        wire.post(BASE + path, payload={"checksums": {"w": "abc"}})
    wire.put(f"{BASE}/v1/agent/desired", payload=AGENT_STATE, repeat=True)
    api = make("agent", session)
    await api.resume()
    await api.update_weights_from_disk("/w/step-2", "v2")
    await api.load_lora("sql", "/m/sql", None)
    await api.set_desired_version("v2")
    await api.set_desired_version(None)
    assert await api.weight_checksums() == {"w": "abc"}
    assert sent(wire) == [
        ("POST", f"{BASE}/resume", None),
        ("POST", f"{BASE}/v1/agent/weights/disk", {"path": "/w/step-2", "version": "v2"}),
        ("POST", f"{BASE}/v1/agent/loras", {"name": "sql", "path": "/m/sql", "version": None}),
        ("PUT", f"{BASE}/v1/agent/desired", {"weight_version": "v2"}),
        ("PUT", f"{BASE}/v1/agent/desired", {"weight_version": None}),
        ("POST", f"{BASE}/weight_checker", {"action": "checksum"}),
    ]


async def test_agent_takes_each_disk_update_step_in_one_call_that_answers_a_read(session, wire):
    wire.post(f"{BASE}/v1/agent/prepare", payload=AGENT_STATE)
    wire.post(
        f"{BASE}/v1/agent/weights/disk",
        payload={"status": "updated", "weight_version": "v2", "checksums": {"model.w": "ab"}},
    )
    wire.post(f"{BASE}/v1/agent/resume", payload=AGENT_STATE | {"paused": False})
    api = make("agent", session)
    assert api.loads_with_checksums is True
    assert (await api.pause_for_update("v2", "keep", 1.0, weights_path="/w")).paused is True
    assert await api.load_from_disk("/w", "v2", checksums=True) == LoadReport("v2", {"model.w": "ab"})
    assert (await api.resume_after_update()).paused is False
    assert sent(wire) == [
        (
            "POST",
            f"{BASE}/v1/agent/prepare",
            {"desired_weight_version": "v2", "mode": "keep", "timeout_s": 1.0, "weights_path": "/w"},
        ),
        ("POST", f"{BASE}/v1/agent/weights/disk", {"path": "/w", "version": "v2", "checksums": True}),
        ("POST", f"{BASE}/v1/agent/resume", None),
    ]


async def test_agent_takes_the_disk_update_in_one_call(session, wire):
    answer = {
        "status": "updated",
        "weight_version": "v2",
        "checksums": {"model.w": "ab"},
        "resumed": True,
        "held_back": None,
        "state": AGENT_STATE | {"paused": False, "weight_version": "v2"},
    }
    wire.post(f"{BASE}/v1/agent/weights/update", payload=answer)
    api = make("agent", session)
    plan = UpdatePlan(
        path="/w",
        version="v2",
        mode="keep",
        pause_timeout_s=1.0,
        checksums=True,
        resume=True,
        expected_checksums={"model.w": "ab"},
    )
    report = await api.update_in_one_call(plan)
    assert report.load == LoadReport("v2", {"model.w": "ab"}) and report.resumed and report.held_back is None
    assert (report.status.paused, report.status.weight_version) == (False, "v2")
    assert sent(wire) == [
        (
            "POST",
            f"{BASE}/v1/agent/weights/update",
            {
                "path": "/w",
                "version": "v2",
                "mode": "keep",
                "timeout_s": 1.0,
                "checksums": True,
                "resume": True,
                "expected_checksums": {"model.w": "ab"},
            },
        )
    ]


async def test_an_agent_older_than_the_one_call_update_gets_the_three_calls(session, wire):
    """A rolling upgrade of the agents: the three calls an older agent takes, the expected
    checksums then held to here -- they disagree, so it is not resumed."""
    plan = UpdatePlan(
        path="/w",
        version="v2",
        mode="keep",
        pause_timeout_s=1.0,
        checksums=True,
        resume=True,
        expected_checksums={"model.w": "ab"},
    )
    api = make("agent", session)
    wire.post(f"{BASE}/v1/agent/weights/update", status=404, payload={"error": {"code": "not_found", "message": "x"}})
    wire.post(f"{BASE}/v1/agent/prepare", payload=AGENT_STATE)
    wire.post(
        f"{BASE}/v1/agent/weights/disk",
        payload={"status": "updated", "weight_version": "v2", "checksums": {"model.w": "cd"}},
    )
    wire.get(f"{BASE}/v1/agent/state", payload=AGENT_STATE | {"weight_version": "v2"})
    report = await api.update_in_one_call(plan)
    assert not report.resumed and "1 of 1 tensors differ (model.w)" in (report.held_back or "")
    assert [(m, u) for m, u, _ in sent(wire)] == [
        ("POST", f"{BASE}/v1/agent/weights/update"),
        ("POST", f"{BASE}/v1/agent/prepare"),
        ("POST", f"{BASE}/v1/agent/weights/disk"),
        ("GET", f"{BASE}/v1/agent/state"),
    ]


async def test_agent_disk_update_uses_the_weight_load_deadline(session, wire):
    wire.post(f"{BASE}/v1/agent/weights/disk", callback=slow(0.7), repeat=True)
    await make("agent", session, weight_load_timeout_s=2.0).update_weights_from_disk("/w", "v2")  # > 0.5 default
    with pytest.raises(WorkerTimeout):
        await make("agent", session, weight_load_timeout_s=0.05).update_weights_from_disk("/w", "v2")


async def test_agent_unload_escapes_the_name_and_treats_404_as_done(session, wire):
    wire.delete(
        f"{BASE}/v1/agent/loras/org%2Fsql",
        status=404,
        payload={"error": {"code": "not_found", "message": "no LoRA named 'org/sql' is loaded"}},
    )
    await make("agent", session).unload_lora("org/sql")
    assert sent(wire) == [("DELETE", f"{BASE}/v1/agent/loras/org%2Fsql", None)]


async def test_agent_unload_500_is_retried_then_rejected(session, wire):
    wire.delete(
        f"{BASE}/v1/agent/loras/sql",
        status=500,
        payload={"error": {"code": "internal", "message": "boom"}},
        repeat=True,
    )
    with pytest.raises(WorkerRejected) as err:
        await make("agent", session).unload_lora("sql")
    assert err.value.status == 500 and "boom" in err.value.reason
    assert len(sent(wire)) == 3


async def test_agent_400_is_not_retried(session, wire):
    wire.post(
        f"{BASE}/v1/agent/loras",
        status=400,
        payload={"error": {"code": "bad_request", "message": "no dir"}},
        repeat=True,
    )
    with pytest.raises(WorkerRejected) as err:
        await make("agent", session).load_lora("sql", "/nope", "1")
    assert err.value.status == 400 and len(sent(wire)) == 1


async def test_agent_connection_error_is_unreachable_after_retries(session, wire):
    wire.post(f"{BASE}/resume", exception=aiohttp.ClientConnectionError("refused"), repeat=True)
    with pytest.raises(WorkerUnreachable):
        await make("agent", session).resume()
    assert len(sent(wire)) == 3


class CountingTransport(HttpTransport):
    """The real transport, counting the attempts it sends."""

    attempts = 0

    async def exchange(self, method: str, path: str, json_body: Any, params: dict[str, Any] | None):
        self.attempts += 1
        return await super().exchange(method, path, json_body, params)


def counting(session: aiohttp.ClientSession, port: int) -> CountingTransport:
    # The default schedule (attempts, backoff): three attempts with waits of 0.1-2 s between them.
    return CountingTransport(
        session=session, worker_id="w0", base_url=f"http://127.0.0.1:{port}", token=None, policy=CallPolicy()
    )


async def test_a_refused_connection_fails_at_once_without_retries(session):
    # A real port nothing listens on: retrying it held every healthy member of an operation
    # paused for the backoff (~1.8 s) for a worker that was not coming back within it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = counting(session, port)
    with pytest.raises(WorkerRefused) as err:
        await transport.request("POST", "/resume")
    assert transport.attempts == 1 and err.value.code == "unreachable", err.value


async def test_a_reset_connection_is_still_retried(session):
    # A real listener that accepts and closes at once: the connection is lost before any answer.
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    async with server:
        transport = counting(session, server.sockets[0].getsockname()[1])
        with pytest.raises(WorkerUnreachable) as err:
            await transport.request("POST", "/resume")
    assert transport.attempts == 3 and not isinstance(err.value, WorkerRefused), err.value


async def test_agent_status_read_is_not_retried(session, wire):
    # The poller's next read is the retry; a dead worker costs one deadline per poll.
    wire.get(f"{BASE}/v1/agent/state", exception=aiohttp.ClientConnectionError("refused"), repeat=True)
    with pytest.raises(WorkerUnreachable):
        await make("agent", session).status()
    assert len(sent(wire)) == 1


async def test_agent_slow_answer_is_a_timeout(session, wire):
    wire.get(f"{BASE}/v1/agent/state", callback=slow(2.0, AGENT_STATE), repeat=True)
    with pytest.raises(WorkerTimeout):
        await make("agent", session).status()


async def test_agent_weight_transfer_bodies(session, wire):
    for path in ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update"):
        wire.post(BASE + path, payload={"message": "ok"})
    api = make("agent", session)
    await api.init_weight_transfer({"master_port": 29500, "rank_offset": 1}, 5.0)
    await api.start_weight_update()
    await api.update_weights({"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}, 5.0)
    await api.finish_weight_update("v3")
    assert sent(wire) == [
        ("POST", f"{BASE}/init_weight_transfer_engine", {"init_info": {"master_port": 29500, "rank_offset": 1}}),
        ("POST", f"{BASE}/start_weight_update", None),
        (
            "POST",
            f"{BASE}/update_weights",
            {"update_info": {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}},
        ),
        ("POST", f"{BASE}/finish_weight_update", {"weight_version": "v3"}),
    ]


@pytest.mark.parametrize("flavor", ["agent", "vllm"])
@pytest.mark.parametrize("call", ["init", "start", "update", "finish"])
async def test_weight_transfer_is_never_retried(session, wire, flavor, call):
    for path in ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update"):
        wire.post(BASE + path, status=503, payload={"error": "busy"}, repeat=True)
    api = make(flavor, session)
    run = {
        "init": lambda: api.init_weight_transfer({}, 5.0),
        "start": api.start_weight_update,
        "update": lambda: api.update_weights({}, 5.0),
        "finish": lambda: api.finish_weight_update("v"),
    }[call]
    with pytest.raises(WorkerRejected) as err:
        await run()
    assert err.value.status == 503
    assert len(sent(wire)) == 1  # one attempt, and (vllm) no prefix-cache reset after a failed finish


async def test_weight_transfer_timeout_is_its_own_deadline_and_not_retried(session, wire):
    wire.post(f"{BASE}/update_weights", callback=slow(0.7), repeat=True)
    await make("agent", session).update_weights({}, 2.0)  # answers after the 0.5 s default: fine
    with pytest.raises(WorkerTimeout):
        await make("agent", session).update_weights({}, 0.05)
    assert len(sent(wire)) == 2


async def test_sglang_weight_transfer_is_vllms_calls_translated_onto_sglangs_group(session, wire):
    """What the `sglang` driver sends for each of vLLM's calls (SGLang's answers to them are checked
    against the real server in test_sglang.py, beside this file). The trainer's rendezvous is a real
    socket."""
    rendezvous = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = rendezvous.sockets[0].getsockname()[1]
    wire.post(
        f"{BASE}/destroy_weights_update_group",
        status=400,
        payload={"success": False, "message": "The group to be destroyed does not exist."},
    )
    for path in ("/init_weights_update_group", "/begin_weight_update", "/end_weight_update"):
        wire.post(BASE + path, payload={"success": True, "message": "ok"})
    wire.post(f"{BASE}/update_weights_from_distributed", payload={"success": True, "message": "ok"}, repeat=True)
    api = make("sglang", session)
    assert "broadcast" in capabilities(api) and api.transfer_wire == "sglang"
    try:
        init = {"master_address": "127.0.0.1", "master_port": port, "world_size": 3, "backend": "gloo"}
        await api.init_weight_transfer(init | {"rank_offset": 2}, 5.0)
    finally:
        rendezvous.close()
    await api.start_weight_update()
    await api.update_weights({"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 3]]}, 5.0)
    await api.finish_weight_update("v3")
    group = {"group_name": "weight_update_group"}
    assert sent(wire) == [
        ("POST", f"{BASE}/destroy_weights_update_group", group),
        ("POST", f"{BASE}/init_weights_update_group", init | group | {"rank_offset": 2}),
        ("POST", f"{BASE}/begin_weight_update", {}),
        (
            "POST",
            f"{BASE}/update_weights_from_distributed",
            {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2, 3]], "flush_cache": False}
            | group
            | {"abort_all_requests": False},
        ),
        (
            "POST",
            f"{BASE}/update_weights_from_distributed",
            {"names": [], "dtypes": [], "shapes": [], "flush_cache": True, "weight_version": "v3"}
            | group
            | {"abort_all_requests": False},
        ),
        ("POST", f"{BASE}/end_weight_update", {}),
    ]


async def test_sglang_refuses_a_vllm_wire_trainer_and_a_trainer_that_never_listens_without_calling_sglang(
    session, wire
):
    api = make("sglang", session)
    unused = free_port()
    with pytest.raises(WorkerRejected, match="does not take: buffer_size_bytes, timeout_s"):
        await api.init_weight_transfer(
            {"master_address": "127.0.0.1", "master_port": unused, "rank_offset": 1, "world_size": 2}
            | {"timeout_s": 5.0, "buffer_size_bytes": 64},
            5.0,
        )
    with pytest.raises(WorkerRejected, match="master_port, world_size missing or mistyped"):
        await api.init_weight_transfer({"master_address": "127.0.0.1", "master_port": "x", "rank_offset": 1}, 5.0)
    with pytest.raises(WorkerRejected, match="did not accept a connection in time"):
        wire.post(f"{BASE}/destroy_weights_update_group", payload={"success": True, "message": "ok"})
        init = {"master_address": "127.0.0.1", "master_port": unused, "rank_offset": 1, "world_size": 2}
        await api.init_weight_transfer(init, 0.5)
    assert [path for _, path, _ in sent(wire)] == [f"{BASE}/destroy_weights_update_group"]  # never the join
    with pytest.raises(WorkerRejected, match="no weight-update group joined"):
        await api.update_weights({"names": [], "dtype_names": [], "shapes": []}, 1.0)


async def test_sglang_chunk_that_failed_ends_the_session_and_withdraws_the_old_version(session, wire):
    """The operation calls no finish on a worker whose chunk failed; SGLang keeps what loaded, so the
    driver ends the session itself and names the weights as no version (what its status reads)."""
    api = make("sglang", session)
    api._group = "weight_update_group"  # joined (the join itself: the test above)
    wire.post(f"{BASE}/begin_weight_update", payload={"success": True, "message": "ok"})
    wire.post(
        f"{BASE}/update_weights_from_distributed",
        status=400,
        payload={"success": False, "message": "Failed to update parameter online: ... partially updated"},
    )
    wire.post(f"{BASE}/update_weights_from_distributed", payload={"success": True, "message": "ok"})
    wire.post(f"{BASE}/end_weight_update", payload={"success": True, "message": "ok"})
    await api.start_weight_update()
    with pytest.raises(WorkerRejected, match="partially updated"):
        await api.update_weights({"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]]}, 5.0)
    withdrawn = [body for _, path, body in sent(wire) if path.endswith("/update_weights_from_distributed")][-1]
    assert (withdrawn["names"], withdrawn["weight_version"], withdrawn["flush_cache"]) == ([], UNNAMED_WEIGHTS, True)
    assert sent(wire)[-1][1] == f"{BASE}/end_weight_update"
    info = {"weight_version": UNNAMED_WEIGHTS, "served_model_name": "tiny", "model_path": "/m/base"}
    wire.get(f"{BASE}/model_info", payload=info)
    wire.get(f"{BASE}/v1/loads", payload={"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})
    wire.get(f"{BASE}/v1/models", payload={"data": [{"id": "tiny", "parent": None}]})
    assert (await api.status()).weight_version is None


# -- vllm ----------------------------------------------------------------------------------
# Only fault shapes a stock `vllm serve` cannot be made to produce on demand (a 503 from a dead
# engine core behind a live API server, slow answers, a refused cache reset, an older vLLM).
# Everything it does produce is tested against two real servers in test_vllm_serve.py, beside this file.
MODELS = {
    "object": "list",
    "data": [
        {"id": "tiny", "object": "model", "root": "/m/base", "parent": None, "max_model_len": 512},
        {"id": "sql", "object": "model", "root": "/m/sql", "parent": "tiny", "max_model_len": 512},
    ],
}


def mock_vllm_reads(m: aioresponses, *, health: int = 200, paused_status: int = 200) -> None:
    m.get(f"{BASE}/health", status=health, body="", repeat=True)
    m.get(
        f"{BASE}/is_paused",
        status=paused_status,
        payload={"is_paused": True} if paused_status == 200 else {"error": "Failed to fetch pause status: engine dead"},
        repeat=True,
    )
    m.get(f"{BASE}/weight_info", payload={"weight_version": "v7"})
    m.get(f"{BASE}/v1/models", payload=MODELS)
    m.get(f"{BASE}/get_world_size", payload={"world_size": 4})


async def test_vllm_dead_engine_is_reported_not_raised(session, wire):
    mock_vllm_reads(wire, health=503, paused_status=500)
    status = await make("vllm", session).status()
    assert status.engine_alive is False and status.ready is False and "engine dead" in status.not_ready_reason


async def test_vllm_failed_read_with_live_engine_raises(session, wire):
    mock_vllm_reads(wire, paused_status=500)
    with pytest.raises(WorkerRejected) as err:
        await make("vllm", session).status()
    assert err.value.status == 500 and "engine dead" in err.value.reason


async def test_vllm_pause_and_resume(session, wire):
    wire.post(f"{BASE}/pause?mode=wait", callback=slow(0.7, {"status": "paused"}))
    wire.post(f"{BASE}/resume", payload={"status": "resumed"})
    api = make("vllm", session)
    await api.pause("wait", 0.2)  # answers after the 0.5 s default: the deadline is timeout_s + grace
    await api.resume()
    assert sent(wire) == [("POST", f"{BASE}/pause?mode=wait", None), ("POST", f"{BASE}/resume", None)]


async def test_vllm_reload_uses_the_weight_load_deadline(session, wire):
    wire.post(f"{BASE}/collective_rpc", callback=slow(0.7), repeat=True)
    wire.post(f"{BASE}/update_weight_version", payload={"success": True, "new_version": "v8"})
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": True})
    await make("vllm", session, weight_load_timeout_s=2.0).update_weights_from_disk("/w", "v8")  # > 0.5 default
    wire.requests.clear()
    with pytest.raises(WorkerTimeout):
        await make("vllm", session, weight_load_timeout_s=0.05).update_weights_from_disk("/w", "v8")
    assert [u for _, u, _ in sent(wire)] == [f"{BASE}/collective_rpc"]  # not retried, no version set


async def test_vllm_cache_reset_refused_is_an_error(session, wire):
    wire.post(
        f"{BASE}/v1/load_lora_adapter",
        body="Success: LoRA adapter 'sql' added successfully.",
        content_type="text/plain",
    )
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": False}, repeat=True)
    with pytest.raises(WorkerRejected) as err:
        await make("vllm", session).load_lora("sql", "/m/sql", "2")
    assert err.value.status == 200 and "success=false" in err.value.reason
    assert sent(wire)[0] == (
        "POST",
        f"{BASE}/v1/load_lora_adapter",
        {"lora_name": "sql", "lora_path": "/m/sql", "load_inplace": True},
    )
    assert len(sent(wire)) == 2


async def test_vllm_unload_and_its_404(session, wire):
    wire.post(f"{BASE}/v1/unload_lora_adapter", body="Success", content_type="text/plain")
    wire.post(
        f"{BASE}/v1/unload_lora_adapter",
        status=404,
        payload={"error": {"message": "The lora adapter 'sql' cannot be found.", "type": "NotFoundError", "code": 404}},
    )
    api = make("vllm", session)
    await api.unload_lora("sql")
    await api.unload_lora("sql")  # already gone: still fine
    assert sent(wire) == [("POST", f"{BASE}/v1/unload_lora_adapter", {"lora_name": "sql"})] * 2


async def test_vllm_without_the_weight_checker_verifies_by_version_only(session, wire):
    # vLLM releases before the RL router's /weight_checker answer 404 (0.32 has it).
    wire.post(f"{BASE}/weight_checker", status=404, payload={"detail": "Not Found"})
    assert await make("vllm", session).weight_checksums() is None
    assert sent(wire) == [("POST", f"{BASE}/weight_checker", {"action": "checksum"})]


async def test_vllm_takes_no_desired_version(session):
    assert "desired_version" not in capabilities(make("vllm", session))  # stock vLLM cannot gate readiness


async def test_vllm_takes_the_disk_update_in_four_rounds_its_load_answering_version_and_checksums(session, wire):
    wire.post(f"{BASE}/pause?mode=keep", payload={"status": "paused"})
    wire.post(f"{BASE}/collective_rpc", payload={})
    wire.post(f"{BASE}/update_weight_version", payload={"success": True, "new_version": "v8"})
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": True})
    wire.post(f"{BASE}/weight_checker", payload={"checksums": {"model.w": "ab"}})
    wire.post(f"{BASE}/resume", payload={"status": "resumed"})
    api = make("vllm", session)
    assert api.loads_with_checksums is True
    assert await api.pause_for_update("v8", "keep", 1.0, weights_path="/w") is None  # cannot check it again
    # The reload, then the version, the cache reset and the checksums at once (one round).
    assert await api.load_from_disk("/w", "v8", checksums=True) == LoadReport("v8", {"model.w": "ab"})
    assert await api.resume_after_update() is None
    calls = sent(wire)
    assert calls[:2] == [
        ("POST", f"{BASE}/pause?mode=keep", None),
        ("POST", f"{BASE}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": "/w"}}),
    ]
    assert sorted(calls[2:5]) == [
        ("POST", f"{BASE}/reset_prefix_cache?reset_running_requests=true", None),
        ("POST", f"{BASE}/update_weight_version", {"new_version": "v8"}),
        ("POST", f"{BASE}/weight_checker", {"action": "checksum"}),
    ]
    assert calls[5:] == [("POST", f"{BASE}/resume", None)]


async def test_vllm_load_without_checksums_does_not_hash(session, wire):
    wire.post(f"{BASE}/collective_rpc", payload={})
    wire.post(f"{BASE}/update_weight_version", payload={"success": True, "new_version": "v8"})
    wire.post(f"{BASE}/reset_prefix_cache?reset_running_requests=true", payload={"success": True})
    assert await make("vllm", session).load_from_disk("/w", "v8", checksums=False) == LoadReport("v8", None)
    assert len(sent(wire)) == 3


# -- dynamo --------------------------------------------------------------------------------
# Dynamo's real answers (version shape, an error inside a 200, the route bodies, /health) are
# proven against Dynamo 1.6.1's own worker in tests/controlplane/workers/flavors/test_dynamo.py. Only what that
# software cannot be made to produce stays here.
async def test_dynamo_500_is_retried_then_rejected(session, wire):
    wire.post(f"{BASE}/engine/resume_generation", status=500, body="internal", content_type="text/plain", repeat=True)
    with pytest.raises(WorkerRejected) as err:
        await make("dynamo", session).resume()
    assert err.value.status == 500 and len(sent(wire)) == 3


async def test_dynamo_without_probe_routes_has_unknown_liveness(session, wire):
    # An older system port: no liveness_probe, no /health (Dynamo 1.6.1 has both).
    wire.post(f"{BASE}/engine/get_weight_version", payload={"status": "ok", "version": None, "version_declared": False})
    wire.post(f"{BASE}/engine/liveness_probe", status=404, body="not found", content_type="text/plain")
    wire.get(f"{BASE}/health", status=404, body="not found", content_type="text/plain")
    status = await make("dynamo", session).status()
    assert status.engine_alive is None and status.ready is None and status.weight_version is None


async def test_dynamo_dead_engine_is_not_ready(session, wire):
    # What Dynamo's liveness_probe answers when the engine check fails; a CPU engine here
    # cannot be made to fail its health check without killing the worker.
    wire.post(f"{BASE}/engine/get_weight_version", payload={"status": "ok", "version": "v5", "version_declared": True})
    wire.post(f"{BASE}/engine/liveness_probe", payload={"status": "error", "alive": False, "message": "dead"})
    wire.get(f"{BASE}/health", payload={"status": "ready"})
    status = await make("dynamo", session).status()
    assert status.engine_alive is False and status.ready is False and status.weight_version == "v5"


async def test_dynamo_takes_the_disk_update_steps_as_separate_calls(session, wire):
    for route in ("pause_generation", "update_weights_from_disk", "resume_generation"):
        wire.post(f"{BASE}/engine/{route}", payload={"status": "ok"})
    api = make("dynamo", session)
    assert await api.pause_for_update("v8", "keep", 1.0, weights_path="/w") is None
    assert await api.load_from_disk("/w", "v8", checksums=True) is None
    wire.post(f"{BASE}/engine/get_weight_version", payload={"status": "ok", "version": "v8", "version_declared": True})
    wire.post(f"{BASE}/engine/liveness_probe", payload={"status": "ok", "alive": True})
    wire.get(f"{BASE}/health", payload={"status": "ready"})
    # The resume answers a fresh status: the controller holds the new version before the
    # member serves again (a Dynamo worker cannot refuse a request sent for other weights).
    status = await api.resume_after_update()
    assert status.weight_version == "v8" and status.paused is False
    assert sent(wire)[:3] == [
        ("POST", f"{BASE}/engine/pause_generation", {"mode": "keep", "clear_cache": False}),
        ("POST", f"{BASE}/engine/update_weights_from_disk", {"model_path": "/w", "weight_version": "v8"}),
        ("POST", f"{BASE}/engine/resume_generation", {}),
    ]


async def test_dynamo_pause_state_is_what_the_drivers_own_calls_left(session, wire):
    # Dynamo has no pause read: a new worker (a new instance, so a new driver) starts
    # unpaused; a pause counts from the moment it is asked, a resume once it answered ok.
    for route in ("get_weight_version", "liveness_probe"):
        wire.post(
            f"{BASE}/engine/{route}",
            payload={"status": "ok", "version": "v1", "version_declared": True, "alive": True},
            repeat=True,
        )
    wire.get(f"{BASE}/health", payload={"status": "ready"}, repeat=True)
    wire.post(f"{BASE}/engine/pause_generation", payload={"status": "ok"})
    wire.post(f"{BASE}/engine/resume_generation", status=500, body="boom", content_type="text/plain", repeat=True)
    api = make("dynamo", session)
    assert (await api.status()).paused is False
    await api.pause("keep", 1.0)
    assert (await api.status()).paused is True
    with pytest.raises(WorkerRejected):
        await api.resume()
    assert (await api.status()).paused is True  # a failed resume leaves it paused, as far as anyone knows


async def test_dynamo_reconcile_reload_of_a_running_worker_pauses_it_first(session, wire):
    # Dynamo refuses a reload of a worker not paused through pause_generation (inside a 200,
    # seen in tests/e2e/test_dynamo_rollouts.py); the reconciler asks for the reload alone.
    for route in ("pause_generation", "update_weights_from_disk", "resume_generation"):
        wire.post(f"{BASE}/engine/{route}", payload={"status": "ok"})
    await make("dynamo", session).update_weights_from_disk("/w", "v9")
    assert sent(wire) == [
        ("POST", f"{BASE}/engine/pause_generation", {"mode": "abort", "clear_cache": False}),
        ("POST", f"{BASE}/engine/update_weights_from_disk", {"model_path": "/w", "weight_version": "v9"}),
        ("POST", f"{BASE}/engine/resume_generation", {}),
    ]


async def test_dynamo_failed_reconcile_reload_stays_paused(session, wire):
    wire.post(f"{BASE}/engine/pause_generation", payload={"status": "ok"})
    wire.post(f"{BASE}/engine/update_weights_from_disk", payload={"status": "error", "message": "no tensors"})
    api = make("dynamo", session)
    with pytest.raises(WorkerRejected, match="no tensors"):
        await api.update_weights_from_disk("/bad", "v9")
    assert [path for _, path, _ in sent(wire)] == [
        f"{BASE}/engine/pause_generation",
        f"{BASE}/engine/update_weights_from_disk",
    ]  # no resume
    wire.post(f"{BASE}/engine/update_weights_from_disk", payload={"status": "ok"})
    await api.update_weights_from_disk("/w", "v9")  # paused already: the reload alone
    assert sent(wire)[-1] == (
        "POST",
        f"{BASE}/engine/update_weights_from_disk",
        {"model_path": "/w", "weight_version": "v9"},
    )


def dynamo_with_routes(session, routes):
    spec = WorkerSpec(id="w0", admin_url=BASE, flavor="dynamo", routes=routes)
    transport = HttpTransport(session=session, worker_id="w0", base_url=BASE, token="tok", policy=POLICY)
    return make_driver(spec, transport, DriverDeadlines(weight_load_s=600.0, grace_s=GRACE_S))


async def test_dynamo_capabilities_follow_the_published_routes(session, wire):
    assert capabilities(make("dynamo", session)) == {"control", "disk_weights", "lora", "sleep"}  # none published
    without_lora = (
        "get_weight_version",
        "liveness_probe",
        "pause_generation",
        "resume_generation",
        "update_weights_from_disk",
        "flush_cache",
    )
    # Sleep is never in the published list (Dynamo's worker factory registers control/sleep itself).
    assert capabilities(dynamo_with_routes(session, without_lora)) == {"control", "disk_weights", "sleep"}
    assert capabilities(dynamo_with_routes(session, ("pause_generation", "load_lora", "unload_lora"))) == {
        "lora",
        "sleep",
    }
    assert capabilities(dynamo_with_routes(session, ())) == {"sleep"}
    assert sent(wire) == []


async def test_dynamo_has_no_broadcast_to_call(session, wire):
    api = dynamo_with_routes(
        session,
        (
            "init_weights_update_group",
            "update_weights_from_distributed",
            "destroy_weights_update_group",
            "pause_generation",
            "resume_generation",
        ),
    )
    assert capabilities(api) == {"control", "sleep"}  # Dynamo's group routes call engine RPCs vLLM lacks
    for name in ("init_weight_transfer", "start_weight_update", "update_weights", "finish_weight_update"):
        assert not hasattr(
            api, name
        )  # an operation that needs it is refused up front (tests/controlplane/operations/test_operations_memory.py)
    assert sent(wire) == []


# -- the engine passthrough ---------------------------------------------------------------------
async def test_engine_routes_are_sent_where_each_flavor_serves_them_once_without_retry(session, wire):
    """Stock vLLM and the agent serve engine routes at the admin root, Dynamo under /engine; a
    POST's body goes as it is; a 5xx is not retried (an allowlisted route need not be idempotent)."""
    wire.post(f"{BASE}/reset_prefix_cache", payload={})
    wire.get(f"{BASE}/is_sleeping", payload={"is_sleeping": False})
    wire.post(f"{BASE}/engine/flush_cache", payload={"status": "ok"})
    wire.post(f"{BASE}/abort_requests", status=500, body="boom", content_type="text/plain")
    assert await make("vllm", session).engine_call("POST", "reset_prefix_cache", None) == {}
    assert await make("vllm", session).engine_call("GET", "is_sleeping", None) == {"is_sleeping": False}
    assert await make("dynamo", session).engine_call("POST", "flush_cache", {"a": 1}) == {"status": "ok"}
    with pytest.raises(WorkerRejected):
        await make("agent", session).engine_call("POST", "abort_requests", {"request_ids": None})
    assert sent(wire) == [
        ("POST", f"{BASE}/reset_prefix_cache", None),
        ("GET", f"{BASE}/is_sleeping", None),
        ("POST", f"{BASE}/engine/flush_cache", {"a": 1}),
        ("POST", f"{BASE}/abort_requests", {"request_ids": None}),
    ]

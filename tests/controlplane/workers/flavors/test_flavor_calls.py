"""What every driver shares on the wire: the factory that picks one by flavor, connection
failures (a refused connection fails at once, a reset one is retried), weight-transfer calls
never retried, and the engine passthrough sent where each flavor serves it.

aioresponses stands in for the workers; the session, HttpTransport and tenacity are real.
An unmocked request fails as a connection error, so a call a flavor should not make
shows up as a failure, not as silence (the `wire` and `session` fixtures: conftest.py).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

from rlcp.controlplane.deadlines import DriverDeadlines
from rlcp.controlplane.workers.flavors.agent import AgentDriver
from rlcp.controlplane.workers.flavors.dynamo import DynamoDriver
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
from tests.controlplane.workers.flavors.wire import BASE, GRACE_S, POLICY, make, sent, slow


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

"""The two stock `vllm serve` processes the tests of this folder share (started once for both
modules, ~50 s each in parallel; the SIGKILL test, last of the package, restarts one), the
reference outputs, and each test's own controller."""

from __future__ import annotations

import gc

import aiohttp
import pytest

from rlcp.harness import access_log, hold
from rlcp.harness.controller import controller_settings, serving_controller
from rlcp.harness.processes import stop_all
from rlcp.harness.servers import VllmServeProcess
from tests.controlplane.workers.flavors.vllm_serve.support import (
    LONG_PROMPT,
    N_STREAMS,
    complete,
    reload_direct,
    restore,
)


# -- the servers, shared by the package -------------------------------------------------------
@pytest.fixture
async def http():
    # One connection per request: a pooled one may have been closed by uvicorn's keep-alive
    # timeout meanwhile (a ServerDisconnectedError that says nothing about the flavor).
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4 * N_STREAMS, force_close=True)) as s:
        yield s


@pytest.fixture(scope="package")
def servers(tiny_models, tmp_path_factory):
    # This process reads 32 streams and runs the controller while two engines keep both cores
    # busy; in full CI runs its loop was seen blocked 8 to 18 s at a time, long enough for every
    # stream to end before the pause could land, until the tests held their streams
    # (support.start_streams). The servers run at a lower priority (nice 10: they still get every
    # cycle this process leaves), and what the session imported so far is frozen out of the
    # garbage collector's reach, so a full collection does not walk it.
    gc.collect()
    gc.freeze()
    workdir = tmp_path_factory.mktemp("vllm-serve")
    procs = [
        VllmServeProcess(
            tiny_models["base"],
            workdir / f"s{i}",
            name=f"vllm-serve-{i}",
            core=i,
            nice=10,
            # The request log the round-trip test reads (`--middleware`: vLLM's own hook).
            # And the harness's hold (rlcp/harness/hold.py: vLLM's `--logits-processors`), so the
            # pause tests hold their streams until the pause has landed.
            extra_args=[
                *("--weight-transfer-config", '{"backend": "gloo"}', "--middleware", access_log.MIDDLEWARE),
                *hold.SERVE_ARGS,
            ],
        )
        for i in range(2)
    ]
    try:
        for p in procs:
            p.spawn()
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        stop_all(procs)
        gc.unfreeze()


@pytest.fixture(scope="package")
def references() -> dict:
    return {}


@pytest.fixture
async def refs(http, servers, tiny_models, references) -> dict:
    """Greedy outputs of weights-1 (the base) and weights-2, each loaded straight into server 0."""
    if not references:
        references[1] = await complete(http, servers[0])
        references["long", 1] = await complete(http, servers[0], prompt=LONG_PROMPT)
        await reload_direct(http, servers[0], tiny_models["weights-2"])
        references[2] = await complete(http, servers[0])
        references["long", 2] = await complete(http, servers[0], prompt=LONG_PROMPT)
        await reload_direct(http, servers[0], tiny_models["weights-1"])
        assert await complete(http, servers[0]) == references[1] != references[2]
    return references


@pytest.fixture
async def ctl(http, servers, tiny_models, refs, tmp_path):
    """A controller with flavor `vllm` over both servers, once both are polled."""
    async for c in _controller(http, servers, tiny_models, tmp_path, poll_s=0.2):
        yield c


@pytest.fixture
async def quiet_ctl(http, servers, tiny_models, refs, tmp_path):
    """As `ctl`, its background status reads and reconcile passes a minute apart: whatever a server
    logs during an operation is the operation's."""
    async for c in _controller(http, servers, tiny_models, tmp_path, poll_s=60):
        yield c


async def _controller(http, servers, tiny_models, tmp_path, *, poll_s: float):
    specs = [s.spec(f"vllm-{i}") for i, s in enumerate(servers)]
    settings = controller_settings(
        tmp_path,
        specs,
        allowed_roots=[str(tiny_models["base"].parent)],
        workers={
            "token": "unused-by-stock-vllm",
            "timeout_s": 10,
            "attempts": 2,
            "retry_budget_s": 20,
            "pause_timeout_s": 60,
            "weight_load_timeout_s": 120,
        },
        reconcile={"poll_interval_s": poll_s, "interval_s": poll_s, "backoff_initial_s": 0.5, "backoff_max_s": 4},
        weight_transfer={"init_timeout_s": 150, "chunk_timeout_s": 150},
    )
    try:
        async with serving_controller(settings, reachable_timeout_s=30) as ctl:
            yield ctl
    finally:
        if all(s.running() for s in servers):
            await restore(http, servers, tiny_models)

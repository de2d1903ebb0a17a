"""The SGLang server the tests of this folder share (one start, ~100 CPU-s: both modules run on
it, and the restart test, last of the package, kills it), the stock `vllm serve` of the mixed fleet,
the reference outputs, and each test's own controller."""

from __future__ import annotations

import contextlib

import pytest

from rlcp.harness.controller import serving_controller
from rlcp.harness.servers import VllmServeProcess
from rlcp.harness.sglang import SglangServerProcess, sglang_venv
from tests.conftest import _session_uses
from tests.controlplane.workers.flavors.sglang.support import (
    LONG_PROMPT,
    engine_controller_settings,
    generate,
    load_direct,
    post,
)


@pytest.fixture(scope="package")
def server(tiny_models, tmp_path_factory, request):
    proc = SglangServerProcess(
        tiny_models["base"], tmp_path_factory.mktemp("sglang"), venv=sglang_venv(), start_timeout_s=600
    )
    try:
        if _session_uses(request, "stock_server"):
            # The mixed fleet's stock `vllm serve` starts beside SGLang's server, not on its own later
            # (~40 s on a quiet machine); it idles until that test.
            request.getfixturevalue("_stock_process").spawn()
        yield proc.start()
    finally:
        proc.stop()


@pytest.fixture(scope="package")
def _stock_process(tiny_models, tmp_path_factory):
    """The mixed fleet's stock `vllm serve`, not yet started (`server` may spawn it)."""
    proc = VllmServeProcess(tiny_models["base"], tmp_path_factory.mktemp("vllm-serve"), core=1, nice=10)
    yield proc
    proc.stop()


@pytest.fixture(scope="package")
def stock_server(_stock_process):
    if _stock_process.proc is None:
        _stock_process.spawn()
    return _stock_process.wait_ready()


@pytest.fixture(scope="package")
def references() -> dict:
    """The reference outputs, computed at the package's first test and shared by both modules."""
    return {}


@pytest.fixture
async def refs(http, server, tiny_models, references) -> dict:
    """Greedy outputs of weights-1 (the base) and weights-2, each loaded straight into the server."""
    if not references:
        await load_direct(http, server, tiny_models["weights-1"], "ref-1")
        references[1] = (await generate(http, server))[0]
        references["long", 1] = (await generate(http, server, LONG_PROMPT))[0]
        await load_direct(http, server, tiny_models["weights-2"], "ref-2")
        references[2] = (await generate(http, server))[0]
        references["long", 2] = (await generate(http, server, LONG_PROMPT))[0]
        await load_direct(http, server, tiny_models["weights-1"], "ref-1")
        assert (await generate(http, server))[0] == references[1] != references[2]
    return references


@pytest.fixture
async def ctl(http, server, tiny_models, refs, tmp_path):
    """An in-process controller (with its gateway) over the server as flavor `sglang`."""
    # `model`: the name clients use, as a static config names it (SGLang renames its model to the
    # directory of each disk update, which the refs above already did).
    spec = {"id": "sglang-0", "admin_url": server.url, "inference_url": server.url, "flavor": "sglang", "model": "tiny"}
    settings = engine_controller_settings(
        tmp_path, [spec], tiny_models, token="unused-by-sglang", gateway={"port": 0, "hold_timeout_s": 120}
    )
    try:
        async with serving_controller(settings, reachable_timeout_s=180) as ctl:
            yield ctl
    finally:
        if server.running():
            with contextlib.suppress(Exception):
                await post(http, server, "/continue_generation")
            await load_direct(http, server, tiny_models["weights-1"], "ref-1")

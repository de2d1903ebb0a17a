"""`GET /v1/rl/state` under load, and the cache that makes it cheap.

- The load test runs `bench/load_state.py` for 8 s: 256 SimEngine agents in one process, the
  controller daemon in another, update cycles back to back, and the state read at a target of
  1000 requests/s from this process. It asserts that nothing failed (no error, every cycle ok)
  and writes the figures to bench/out/load_state.json; it asserts no timing (this machine is
  shared). `python bench/load_state.py` reruns it standalone, longer.
- The cache test checks, on an in-process controller, that reads never call a worker and do
  not rebuild the document, and that every change a reader must see (a status poll, an
  operation's result) shows in the very next read.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.api.handling import CONTROLLER
from rlcp.controlplane.assembly import assemble
from rlcp.controlplane.controller import Controller
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.harness.processes import REPO
from rlcp.harness.simfleet import TOKEN, start_fleet

CTL_TOKEN = "ctl-token"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_load_state", REPO / "bench" / "load_state.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
async def test_state_under_load_while_update_cycles_run(tmp_path: Path) -> None:
    bench = _load_bench()
    args = bench.parse_args(
        [
            "--workers",
            "256",
            "--duration-s",
            "8",
            "--rate",
            "1000",
            "--concurrency",
            "64",
            "--out",
            str(REPO / "bench" / "out" / "load_state.json"),
        ]
    )
    result = await bench.measure(args)
    bench.report(result, args.out)
    assert result["errors"] == 0, result["error_samples"]
    assert result["requests"] > 0 and result["bodies_checked"] > 0
    cycles = result["cycles"]
    assert cycles["run"] >= 1 and cycles["ok"] == cycles["run"], cycles["failed"]


async def test_state_reads_are_served_from_a_cache_that_follows_every_change(tmp_path: Path, monkeypatch) -> None:
    agents = await start_fleet(3, [tmp_path])
    settings = ControllerSettings(
        api={"token": CTL_TOKEN},
        gateway={"port": 0},
        discovery={"kind": "static", "static": [a.spec() for a in agents]},
        workers={"token": TOKEN, "timeout_s": 5},
        store={"kind": "memory"},
        allowed_roots=[str(tmp_path)],
        log_format="console",
        log_level="warning",
    )
    client = TestClient(TestServer(assemble(settings, token=CTL_TOKEN, background=False)))
    await client.start_server()
    try:
        ctl: Controller = client.server.app[CONTROLLER]
        ctl.apply_membership([WorkerSpec(**a.spec()) for a in agents])
        builds = status_calls = 0
        real_state = Controller.state

        def counting_state(self: Controller):
            nonlocal builds
            builds += 1
            return real_state(self)

        monkeypatch.setattr(Controller, "state", counting_state)
        for rec in ctl.members():
            real_status = rec.driver.status

            async def counting_status(real=real_status):
                nonlocal status_calls
                status_calls += 1
                return await real()

            monkeypatch.setattr(rec.driver, "status", counting_status)

        async def read() -> dict:
            resp = await client.get("/v1/rl/state")
            assert resp.status == 200 and resp.content_type == "application/json"
            return await resp.json()

        await ctl.refresh()
        assert status_calls == 3
        first = await read()
        assert all(w["reachable"] for w in first["workers"])
        for _ in range(50):
            assert await read() == first
        assert (builds, status_calls) == (1, 3), "reads must neither call workers nor rebuild an unchanged document"

        await ctl.refresh()  # a poll that finds nothing new changes nothing a reader sees (the tag stays)
        assert await read() == first and (builds, status_calls) == (1, 6)
        assert ctl.registry.publish_seen() == 3  # until its last_seen times are shown, all in one change
        second = await read()
        assert builds == 2 and [w["last_seen"] for w in second["workers"]] != [w["last_seen"] for w in first["workers"]]
        assert ctl.registry.publish_seen() == 0

        await agents[0].service.control.pause("keep", 5)  # behind the controller's back: the next poll finds it
        await ctl.refresh()
        third = await read()
        assert builds == 3 and [w["paused"] for w in third["workers"]] == [True, False, False]
        await agents[0].service.control.resume()

        resp = await client.post(
            "/v1/rl/pause", json={"mode": "keep"}, headers={"Authorization": f"Bearer {CTL_TOKEN}"}
        )
        result = await resp.json()
        assert resp.status == 200, result
        paused = await read()  # the operation's outcome, at once
        assert paused["last_operation"]["id"] == result["id"] and paused["pause_state"] == "paused"
        assert paused["desired"]["paused"] is True and all(w["paused"] for w in paused["workers"])
        assert [w["last_result"]["phase"] for w in paused["workers"]] == ["pause"] * 3
    finally:
        await client.close()
        for a in agents:
            await a.stop()

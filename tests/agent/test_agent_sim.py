"""The agent service's fault paths, on SimEngine (hangs and failures a real engine
cannot be made to produce on demand). vLLM behaviour itself is tested on vLLM."""

from __future__ import annotations

import asyncio

import aiohttp

from rlcp.harness.checkpoints import write_checkpoint
from rlcp.harness.http import call
from rlcp.harness.simfleet import TOKEN, SimAgent

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_hanging_engine_call_is_a_504_and_the_agent_stays_usable(sim_agent, tmp_path):
    agent = sim_agent
    default_load_s = agent.service.timeouts.weight_load_s
    agent.service.timeouts.weight_load_s = 0.3  # what the hung load costs this test
    ckpt = write_checkpoint(tmp_path / "c", 1)
    agent.engine.hang_next("load_weights_from_disk")
    async with aiohttp.ClientSession() as http:
        status, body = await call(
            http, "POST", agent.url + "/v1/agent/weights/disk", headers=AUTH, body={"path": str(ckpt), "version": "v1"}
        )
        assert status == 504 and body["error"]["code"] == "deadline_exceeded"
        assert "load_weights_from_disk" in body["error"]["message"]
        st = agent.service.state()
        assert st.last_operations[0].status == "timeout" and st.busy_with is None
        # The load may have half-happened: no version is claimed and the agent is not ready.
        assert st.weight_version is None and not st.ready
        status, _ = await call(http, "GET", agent.url + "/readyz")
        assert status == 503
        # Usable again: a load that does not hang succeeds. Its deadline is the default again, not
        # the 0.3 s the hung one cost (a real load took 0.34 s on a loaded machine: the fast lane
        # beside CI34).
        agent.service.timeouts.weight_load_s = default_load_s
        status, body = await call(
            http, "POST", agent.url + "/v1/agent/weights/disk", headers=AUTH, body={"path": str(ckpt), "version": "v1"}
        )
        assert status == 200 and agent.service.state().ready


async def test_engine_failure_is_a_502_naming_the_step(sim_agent, tmp_path):
    agent = sim_agent
    agent.engine.fail_next("pause", "scheduler exploded")
    async with aiohttp.ClientSession() as http:
        status, body = await call(http, "POST", agent.url + "/pause?mode=keep", headers=AUTH)
        assert status == 502 and body["error"]["code"] == "engine_error"
        assert "pause(mode=keep)" in body["error"]["message"] and "scheduler exploded" in body["error"]["message"]
        assert agent.service.paused is False  # the engine says it did not pause


async def test_dead_engine_fails_health_and_refuses_operations(sim_agent):
    agent = sim_agent
    agent.engine.kill()
    async with aiohttp.ClientSession() as http:
        assert (await call(http, "GET", agent.url + "/healthz"))[0] == 503
        status, body = await call(http, "POST", agent.url + "/resume", headers=AUTH)
        assert status == 503 and body["error"]["code"] == "engine_dead"
        status, body = await call(http, "GET", agent.url + "/v1/agent/state")
        assert status == 200 and body["engine_alive"] is False and body["ready"] is False


async def test_require_desired_version_gates_readiness_until_told(tmp_path):
    a = SimAgent("s1", [tmp_path])
    await a.start()
    try:
        a.service.settings.require_desired_version = True
        assert "desired" in (a.service.not_ready_reason() or "")
        a.service.set_desired_version(None)
        assert a.service.not_ready_reason() is None
    finally:
        await a.stop()


async def test_concurrent_mutations_get_409_reads_still_answer(tmp_path):
    a = await SimAgent("s2", [tmp_path], engine_kwargs={"op_latency_s": 0.5}).start()
    try:
        async with aiohttp.ClientSession() as http:
            pause = asyncio.create_task(call(http, "POST", a.url + "/pause?mode=abort", headers=AUTH))
            async with asyncio.timeout(10):
                while a.service.state().busy_with != "pause":
                    await asyncio.sleep(0.005)
            status, body = await call(http, "POST", a.url + "/resume", headers=AUTH)
            assert status == 409 and "pause" in body["error"]["message"]
            status, body = await call(http, "GET", a.url + "/v1/agent/state")
            assert status == 200 and body["busy_with"] == "pause"
            assert (await pause)[0] == 200
    finally:
        await a.stop()


async def test_an_update_in_one_call_pauses_loads_hashes_and_resumes_only_as_told(sim_agent, tmp_path):
    """`POST /v1/agent/weights/update`: the controller's whole update after its check. Told to
    resume on agreement with checksums its weights do not have, the agent stays paused and says
    why; a load that fails leaves it paused; told to resume, it is back in one call."""
    agent = sim_agent
    v1, v2 = write_checkpoint(tmp_path / "v1", 1), write_checkpoint(tmp_path / "v2", 2)
    async with aiohttp.ClientSession() as http:

        async def update(**body) -> tuple[int, dict]:
            return await call(http, "POST", agent.url + "/v1/agent/weights/update", headers=AUTH, body=body)

        status, body = await update(path=str(v1), version="v1", checksums=True, resume=True)
        assert status == 200 and body["resumed"] and body["held_back"] is None, body
        assert body["weight_version"] == "v1" and body["checksums"] and not agent.service.paused
        assert (body["state"]["paused"], body["state"]["desired_weight_version"]) == (False, "v1")
        agreed = body["checksums"]
        status, body = await update(path=str(v2), version="v2", resume=True, expected_checksums=agreed)
        assert status == 200 and not body["resumed"] and "tensors differ" in body["held_back"], body
        assert body["checksums"] is None and agent.service.paused and body["state"]["weight_version"] == "v2"
        # Already paused: not paused again, and a failed load leaves it so.
        agent.engine.fail_next("load_weights_from_disk")
        status, body = await update(path=str(v1), version="v1b", resume=True)
        assert status == 502 and agent.service.paused, body
        status, body = await update(path=str(v1), version="v1c", resume=True, expected_checksums=agreed)
        assert status == 200 and body["resumed"] and not agent.service.paused, body
        # A path that is not there changes nothing, running or not.
        status, body = await update(path=str(tmp_path / "nope"), version="v9", resume=True)
        assert status == 400 and body["error"]["field"] == "path" and not agent.service.paused
        assert agent.service.desired_weight_version == "v1c"


async def test_one_update_inspects_the_checkpoint_once(sim_agent, tmp_path, monkeypatch):
    """The headers are read once per update: the check's answer is what the load takes, in the
    one-call update and in the disk load alike (the controller's own check before it pauses
    anyone is a request of its own)."""
    from rlcp.agent import checkpoint
    from rlcp.agent.operations import disk

    inspected: list[str] = []
    real = checkpoint.inspect_checkpoint

    def counting(directory):
        inspected.append(directory.name)
        return real(directory)

    monkeypatch.setattr(checkpoint, "inspect_checkpoint", counting)
    monkeypatch.setattr(disk, "inspect_checkpoint", counting)
    v1 = write_checkpoint(tmp_path / "v1", 1)
    async with aiohttp.ClientSession() as http:
        for route in ("/v1/agent/weights/update", "/v1/agent/weights/disk"):
            inspected.clear()
            status, body = await call(
                http, "POST", sim_agent.url + route, headers=AUTH, body={"path": str(v1), "version": "v1"}
            )
            assert status == 200 and body["weight_version"] == "v1", body
            assert inspected == ["v1"], route

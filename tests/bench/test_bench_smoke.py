"""Every benchmark under bench/ runs its code path at a tiny size, so the scripts cannot rot.

These are not performance tests: nothing here asserts a timing. Each benchmark runs
end to end (its fleet or processes, the table, the JSON and the plot) at a size that
takes seconds. Those that need a real vLLM engine (`disk_update`, `pause_latency`,
~30 s of engine start-up each; `rl_run`, two engines and six training runs) run their
reporting path here on a result of the shape they produce; their measuring path runs
whenever the benchmark itself is run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# A guard against a hang, not a verdict on speed: each benchmark waits for its children with
# deadlines of its own and fails at once when one died. At 120 s it failed a loaded fresh-clone
# run: bench.broadcast's two rank processes each import vLLM (18 s here with the machine half busy).
pytestmark = pytest.mark.timeout(600)


def _outputs(out: Path, name: str) -> dict:
    assert (out / f"{name}.png").stat().st_size > 1000
    return json.loads((out / f"{name}.json").read_text())


def test_fanout(tmp_path: Path) -> None:
    from bench import fanout

    fanout.main(
        [
            "--sizes",
            "1,3",
            "--repeats",
            "1",
            "--seq-max",
            "1",
            "--hosts",
            "2",
            "--raw-rounds",
            "1",
            "--latency-s",
            "0.005",
            "--out",
            str(tmp_path),
        ]
    )
    rows = _outputs(tmp_path, "fanout")["rows"]
    assert [r["n"] for r in rows] == [1, 3]
    assert rows[1]["httpx_sequential"]["extrapolated_from_n"] == 1
    assert all(r["controller"]["median_s"] >= r["floor_s"] for r in rows)


def test_state_endpoint(tmp_path: Path) -> None:
    from bench import state_endpoint

    state_endpoint.main(
        [
            "--workers",
            "4",
            "--concurrency",
            "1,2",
            "--duration-s",
            "0.3",
            "--repeats",
            "1",
            "--hosts",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    result = _outputs(tmp_path, "state_endpoint")
    assert [(r["front"], r["concurrency"]) for r in result["rows"]] == [("on", 1), ("on", 2), ("off", 1), ("off", 2)]
    assert all(r["state"]["runs"][0]["requests"] > 0 for r in result["rows"])


def test_broadcast(tmp_path: Path) -> None:
    from bench import broadcast

    broadcast.main(
        [
            "--large-count",
            "2",
            "--large-mb",
            "0.5",
            "--small-count",
            "30",
            "--small-kb",
            "2",
            "--repeats",
            "1",
            "--buffer-mb",
            "0.1",
            "--out",
            str(tmp_path),
        ]
    )
    rows = _outputs(tmp_path, "broadcast")["rows"]
    assert [r["tensors"] for r in rows] == [2, 30]  # and the bytes arrived intact (checked inside)


def test_vllm_benchmarks_report(tmp_path: Path) -> None:
    from bench import disk_update, pause_latency
    from bench.common import write_json

    disk = {
        "bytes": 4_000_000,
        "parameters": 1_000_000,
        "params": {},
        "times_s": {},
        "median_s": {"controller_s": 1.2, "raw_load_s": 1.0, "agent_reload_s": 0.9, "checksum_s": 0.2},
        "ratio_controller_vs_raw": 1.2,
        "ratio_agent_reload_vs_raw": 0.9,
    }
    assert "controller update_weights cycle" in disk_update.render(disk)
    write_json("disk_update", disk, tmp_path)
    disk_update.draw(disk, tmp_path)
    _outputs(tmp_path, "disk_update")
    assert disk_update.parse(["--tiny"]).tiny

    pause = {
        "params": {"batch": 32, "max_tokens": 64, "repeats": 1, "step_tokens": 32},
        "step_s": 0.01,
        "step_runs_s": [0.01],
        "rows": [
            {"mode": m, "pause_s": 0.02, "steps": 2.0, "runs": [], "running_after": 0, "finish_reasons": ["length"]}
            for m in pause_latency.MODES
        ],
    }
    assert "abort" in pause_latency.render(pause)
    write_json("pause_latency", pause, tmp_path)
    pause_latency.draw(pause, tmp_path)
    _outputs(tmp_path, "pause_latency")


def test_rl_run_report(tmp_path: Path) -> None:
    # Its measuring path needs two vLLM engines and six training runs (minutes).
    from bench import rl_run
    from bench.common import write_json
    from rlcp.rl.loop import StepRecord
    from rlcp.rl.sampling import Completion

    def record(step: int, reward: float, sync_s: float) -> StepRecord:
        return StepRecord(
            step=step,
            reward=reward,
            pushed=f"step-{step}",
            sync_error=None,
            mismatch_mean=1e-6,
            mismatch_max=2e-6,
            compared=512,
            versions={f"step-{step - 1}": 512},
            off_policy=0,
            dropped=0,
            workers={"a": 32},
            sample_s=0.5,
            train_s=0.3,
            sync_s=sync_s,
            wall_s=step * 1.0,
        )

    # Step 2 of a sync run: one completion from weights it never pushed ("base"), one that
    # straddled into a version outside the window; async admits the one before and later ones.
    def completion(*versions: str | None) -> Completion:
        return Completion((1,), [5] * len(versions), [-1.0] * len(versions), list(versions), "a")

    pushed = ["base-x", "step-1", "step-2"]
    batches = [
        rl_run.Batch(1, [completion("base-x", "base-x")], ["base-x"]),
        rl_run.Batch(2, [completion("step-1"), completion("base"), completion("step-1", "base-x")], ["step-1"]),
    ]
    wrong = rl_run.wrong_weights(batches, pushed)
    assert (wrong["rollouts"], wrong["wrong_rollouts"], wrong["wrong_tokens"], wrong["never_pushed_tokens"]) == (
        4,
        2,
        2,
        1,
    )
    assert wrong["wrong_by_step"] == {2: 2}

    def run(rewards: list[float], sync_s: float) -> dict:
        records = [record(k, r, sync_s) for k, r in enumerate(rewards, start=1)]
        return {
            "figures": rl_run.figures(records, 0.5),
            "wrong": wrong,
            "sampler_retries": 0,
            "restart_s": 30.0,
            "records": [r.as_json() for r in records],
        }

    runs = {
        "hand-rolled": run([0.0, 0.2, 0.6], 0.4),
        "rlcp sync": run([0.0, 0.5, 0.7], 0.3),
        "rlcp async": run([0.0, 0.1, 0.3], 0.2),
    }
    rl_run.with_ratios(runs)
    assert runs["rlcp sync"]["figures"]["threshold_step"] == 2 and runs["rlcp async"]["figures"]["threshold_s"] is None
    assert runs["rlcp sync"]["figures"]["threshold_ratio"] == 2 / 3
    result = {
        "steps": 3,
        "seed": 0,
        "lr": 1e-2,
        "threshold": 0.5,
        "kill_step": 2,
        "transport": "disk",
        "cases": {"no_kill": runs, "kill": runs},
    }
    text = rl_run.render(result)
    assert "Kill case" in text and "not reached" in text and "2 / 4" in text
    write_json("rl_run", result, tmp_path)
    rl_run.draw(result, tmp_path)
    _outputs(tmp_path, "rl_run")
    assert (tmp_path / "rl_run_kill.png").stat().st_size > 1000
    assert rl_run.parse([]).kill_step == 4


def test_gateway_dynamo_report(tmp_path: Path) -> None:
    # Its measuring path needs Dynamo's processes and two vLLM engines (~30 s of start-up).
    from bench import gateway_dynamo
    from bench.common import write_json

    paths = {
        n: {"p50_ms": 4.0 + i, "p99_ms": 9.0 + i, "mean_ms": 5.0 + i}
        for i, n in enumerate(["frontend", "frontend, pinned", "gateway"])
    }
    result = {
        **paths,
        "added_p50_ms_vs_frontend": 2.0,
        "added_p99_ms_vs_frontend": 2.0,
        "added_p50_ms_vs_frontend_pinned": 1.0,
        "added_p99_ms_vs_frontend_pinned": 1.0,
        "requests_per_path": 1,
    }
    assert "added by the gateway (vs pinned)" in gateway_dynamo.render(result)
    write_json("gateway_dynamo", result, tmp_path)
    gateway_dynamo.draw(result, tmp_path)
    _outputs(tmp_path, "gateway_dynamo")


def test_gateway(tmp_path: Path) -> None:
    from bench import gateway

    result = gateway.main(
        [
            "--requests",
            "20",
            "--concurrency",
            "4",
            "--duration-s",
            "0.3",
            "--repeats",
            "1",
            "--stale-requests",
            "40",
            "--sessions",
            "8",
            "--session-requests",
            "40",
            "--session-concurrency",
            "4",
            "--session-delay-ms",
            "2",
            "--no-pin",
            "--out",
            str(tmp_path),
        ]
    )
    proxies = result["proxies"]
    assert proxies["gateway"]["stale_answers"] == 0 and proxies["gateway"]["answers"] == 40
    assert proxies["gateway"]["cpu_us_per_request"] > 0
    # The routers (the bench extra, which bootstrap installs) in the same run, fence-blind.
    for router in ("vllm-router", "sglang-router"):
        assert proxies[router]["answers"] == 40 and proxies[router]["stale_answers"] > 0, router
        assert result["vs_routers"][router]["cpu_ratio"] > 0
    # Envoy (the envoy extra, in dev too), fed the same fence over xDS: no stale answer either.
    assert proxies["envoy"]["stale_answers"] == 0 and proxies["envoy"]["answers"] == 40
    assert proxies["envoy"]["cpu_us_per_request"] > 0
    # A stale member the fence does not know of: the gateway and Envoy retry its refusals
    # elsewhere (none reaches a client, no stale answer); the routers answer from it.
    for proxy in ("gateway", "envoy"):
        unfenced = proxies[proxy]["unfenced"]
        assert (unfenced["stale_answers"], unfenced["refused"], unfenced["answers"]) == (0, 0, 40), proxy
    assert proxies["vllm-router"]["unfenced"]["stale_answers"] > 0
    assert result["envoy_vs_routers"]["vllm-router"]["cpu_ratio_unfenced_stale"] > 0
    assert sum(result["sessions"]["bounded_load"]["per_worker"]) == 40
    # The one URL: inference through the controller daemon's port and its gateway's own, and the
    # controller's state read at rest and under that load.
    one_url = result["one_url"]
    assert one_url["controller_port"]["cpu_us_per_request"] > 0 and one_url["gateway_port"]["cpu_us_per_request"] > 0
    assert one_url["state_at_rest"]["reads"] > 0 and one_url["state_under_load"]["rollouts_per_s"] > 0
    assert _outputs(tmp_path, "gateway")["paths"]["gateway"]["p50_ms"] == result["paths"]["gateway"]["p50_ms"]


def test_bubble(tmp_path: Path) -> None:
    from bench import bubble

    result = bubble.main(
        [
            "--agents",
            "2",
            "--load-s",
            "0.3",
            "--token-s",
            "0.005",
            "--steady-s",
            "0.5",
            "--cases",
            "all_at_once@1,rolling/1@0",
            "--start-timeout",
            "60",
            "--out",
            str(tmp_path),
        ]
    )
    rows = _outputs(tmp_path, "bubble")["rows"]
    assert [r["case"] for r in rows] == ["all_at_once@1", "rolling/1@0"] and all(r["status"] == "ok" for r in rows)
    # The fence check counts: answers during the updates were checked, and none was outside it.
    assert result["answers"] > 0 and result["outside_fence"] == 0 and result["failed"] == 0
    assert rows[0]["bubble"]["min_serving"] == 0 and rows[1]["progress"]["waves"] == 2


@pytest.mark.ray
@pytest.mark.xdist_group("ray")  # one Ray head at a time: tests/harness/test_ray_head.py
def test_ray_restart(tmp_path: Path) -> None:
    from bench import ray_restart

    ray_restart.main(["--agents", "1", "--kills", "1", "--out", str(tmp_path)])
    result = _outputs(tmp_path, "ray_restart")
    assert len(result["kills"]) == 1 and result["kills"][0]["serving_s"] >= result["kills"][0]["ray_alive_s"]


@pytest.mark.ray
@pytest.mark.xdist_group("ray")  # one Ray head at a time: tests/harness/test_ray_head.py
def test_ray_discovery(tmp_path: Path) -> None:
    from bench import ray_discovery

    ray_discovery.main(["--live", "2", "--sizes", "2,6", "--members", "10", "--repeats", "2", "--out", str(tmp_path)])
    result = _outputs(tmp_path, "ray_discovery")
    assert [(r["size"], r["rows"], r["members"]) for r in result["rows"]] == [(2, 2, 2), (6, 6, 2)]
    assert result["parse"]["members"] == 10


def test_flavor_cycle_polls_at_the_controllers_default_whatever_the_callers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its measuring path needs engines (run with the benchmark); its arguments do not."""
    from bench import flavor_cycle
    from rlcp.controlplane.settings import ControllerSettings
    from rlcp.controlplane.settings.reconcile import ReconcileSettings

    monkeypatch.setenv("RLCP_RECONCILE__POLL_INTERVAL_S", "0.05")
    assert ControllerSettings().reconcile.poll_interval_s == 0.05  # what a settings object would have taken
    args = flavor_cycle.arguments(["--flavors", "agent, vllm"])
    assert args.poll_interval_s == ReconcileSettings().poll_interval_s == flavor_cycle.POLL_INTERVAL_S
    assert args.flavors == ["agent", "vllm"]
    assert flavor_cycle.arguments(["--poll-interval-s", "0.5"]).poll_interval_s == 0.5


def test_trl_fleet_report(tmp_path: Path) -> None:
    # Its measuring path needs three vLLM engines and two TRL runs (minutes; run the benchmark).
    from bench import trl_fleet
    from bench.common import write_json

    def run(step_s: float) -> dict:
        steps = [{"step": k, "reward": 0.001 * k, "wall_s": 40.0 + step_s * (k - 1)} for k in (1, 2, 3)]
        summary = {"steps": steps, "reward_first3": 0.002, "reward_last3": 0.002, "rollouts": 96, "workers": {}}
        return {"figures": trl_fleet.figures(summary), "steps": steps}

    result = {"steps": 3, "seed": 0, "lr": None, "runs": {"one engine": run(8.0), "fleet": run(12.0)}}
    result["step_ratio"] = (
        result["runs"]["fleet"]["figures"]["step_s"] / result["runs"]["one engine"]["figures"]["step_s"]
    )
    assert result["step_ratio"] == 1.5
    assert "ratio fleet ÷ one engine, time per step: 1.50" in trl_fleet.render(result)
    write_json("trl_fleet", result, tmp_path)
    trl_fleet.draw(result, tmp_path)
    _outputs(tmp_path, "trl_fleet")
    assert trl_fleet.parse(["--steps", "4"]).steps == 4

"""Envoy's side of the fence, pure: which members become endpoints, and a bootstrap the real
binary accepts (`envoy --mode validate`: parsed and checked, nothing served)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcp.controlplane.gateway.envoy.bootstrap import FLEET_HEADER, envoy_bootstrap
from rlcp.controlplane.gateway.envoy.fence import Endpoint, address, endpoint
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.wire.controller.state import WorkerView
from rlcp.harness.envoy import envoy_binary
from rlcp.harness.fleet_state import serving_worker

pytestmark = pytest.mark.timeout(60)


def view(**fields: Any) -> WorkerView:
    return serving_worker(**({"worker_id": "w0", "inference_url": "http://127.0.0.1:8000"} | fields))


def test_members_envoy_can_reach_become_endpoints_and_the_others_say_why() -> None:
    assert endpoint(view()) == Endpoint("w0", "127.0.0.1", 8000, "v1")
    assert endpoint(view(inference_url="http://localhost:9")) == Endpoint("w0", "127.0.0.1", 9, "v1")
    assert "a dynamo member is reached through its frontend" in str(endpoint(view(flavor="dynamo")))
    assert "EDS takes addresses" in str(endpoint(view(inference_url="http://pod.svc:8000")))
    assert address("http://127.0.0.1:8000/v1") is None  # a path: not an endpoint


def test_the_bootstrap_is_one_the_real_envoy_accepts(tmp_path: Path) -> None:
    settings = ControllerSettings(
        api={"token": "a"},
        gateway={"token": "gw", "max_in_flight_per_worker": 4, "upstream_idle_timeout_s": 3.5},
        fleets={"teacher": {"selector": "role=teacher"}},
    )
    boot = envoy_bootstrap(settings, xds_host="127.0.0.1", xds_port=18000, admin_token="a")
    routes = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
        "virtual_hosts"
    ][0]["routes"]
    assert [r["route"]["cluster"] for r in routes] == ["rl-teacher-sessions"] * 2 + ["rl-teacher"] + [
        "rl-default-sessions"
    ] * 2 + ["rl-default"]
    assert routes[0]["match"]["headers"][0]["name"] == FLEET_HEADER
    assert [r["route"]["hash_policy"][0]["header"]["header_name"] for r in routes[3:5]] == [
        "x-rl-session",
        "x-session-id",
    ]
    assert routes[5]["route"]["retry_policy"]["retriable_status_codes"] == [409]
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    # A fleet's two clusters read one EDS resource: one assignment, one ACK.
    assert clusters["rl-default-sessions"]["eds_cluster_config"]["service_name"] == "rl-default"
    assert clusters["rl-default"]["eds_cluster_config"]["service_name"] == "rl-default"
    ring = clusters["rl-default-sessions"]["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert ring["typed_config"]["consistent_hashing_lb_config"]["hash_balance_factor"] == 125
    assert clusters["rl-default"]["circuit_breakers"]["per_host_thresholds"] == [{"max_connections": 4}]
    # Idle connections to workers closed before the workers' keep-alive (uvicorn's 5 s) closes them.
    assert GatewaySettings().upstream_idle_timeout_s < 5
    fleet_clusters = [c for name, c in clusters.items() if name.startswith("rl-")]
    assert len(fleet_clusters) == 4
    for c in fleet_clusters:
        options = c["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        assert options["common_http_protocol_options"] == {"idle_timeout": "3.500000s"}
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(boot))
    done = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

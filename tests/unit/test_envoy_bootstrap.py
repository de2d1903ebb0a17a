"""Envoy's side of the fence, pure: which members become endpoints, and a bootstrap the real
binary accepts (`envoy --mode validate`: parsed and checked, nothing served)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from rlcp.controlplane.gateway.envoy.bootstrap import FLEET_HEADER, envoy_bootstrap
from rlcp.controlplane.gateway.envoy.fence import Endpoint, address, endpoint
from rlcp.controlplane.settings import ControllerSettings
from rlcp.core.wire.controller import WorkerView
from rlcp.harness.envoy import envoy_binary

pytestmark = pytest.mark.timeout(60)


def view(**kw: object) -> WorkerView:
    base = dict(id="w0", admin_url="http://127.0.0.1:1", inference_url="http://127.0.0.1:8000", flavor="agent",
                world_size=1, reachable=True, ready=True, serving=True, paused=False, requests=None,
                weight_version="v1", loras={})
    return WorkerView.model_validate(base | kw)


def test_members_envoy_can_reach_become_endpoints_and_the_others_say_why() -> None:
    assert endpoint(view()) == Endpoint("w0", "127.0.0.1", 8000, "v1")
    assert endpoint(view(inference_url="http://localhost:9")) == Endpoint("w0", "127.0.0.1", 9, "v1")
    assert "a dynamo member is reached through its frontend" in str(endpoint(view(flavor="dynamo")))
    assert "EDS takes addresses" in str(endpoint(view(inference_url="http://pod.svc:8000")))
    assert address("http://127.0.0.1:8000/v1") is None  # a path: not an endpoint


def test_the_bootstrap_is_one_the_real_envoy_accepts(tmp_path: Path) -> None:
    settings = ControllerSettings(api={"token": "a"}, gateway={"token": "gw"},
                                  fleets={"teacher": {"selector": "role=teacher"}})
    boot = envoy_bootstrap(settings, xds_host="127.0.0.1", xds_port=18000, admin_token="a")
    routes = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"]
    assert [r["route"]["cluster"] for r in routes] == ["rl-teacher", "rl-default"]
    assert routes[0]["match"]["headers"][0]["name"] == FLEET_HEADER
    assert routes[1]["route"]["retry_policy"]["retriable_status_codes"] == [409]
    path = tmp_path / "bootstrap.yaml"
    path.write_text(yaml.safe_dump(boot))
    done = subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

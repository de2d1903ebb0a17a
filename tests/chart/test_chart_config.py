"""The config files the Helm chart writes load in the controller's and the agent's own settings
models (a key the chart invents would stop the pod at start), and the chart's values schema takes
every flavor and listing format the controller does, refusing what the controller refuses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from rlcp.agent.settings import AgentSettings
from rlcp.agent.settings import load_settings as load_agent_settings
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.settings import load_settings as load_controller_settings
from rlcp.controlplane.settings.discovery import HttpListingSettings, ListingFormat
from rlcp.controlplane.workerspec import FLAVORS
from tests.chart.render import (
    CHART,
    CI_VALUES,
    FULLNAME,
    NAMESPACE,
    Doc,
    _template,
    mounted_config,
    of_kind,
    one,
    pod_spec,
    render,
    rules,
)


def _env_of(container: Doc) -> dict[str, str]:
    """The container's RLCP_/RLAGENT_ variables, downward-API ones given sample values."""
    sample = {"metadata.name": "pod-0", "metadata.namespace": NAMESPACE}
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = sample[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_rendered_config_loads_in_the_controller_settings(
    helm: str, values: Path | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(helm, *(["--values", str(values)] if values else []))
    deployment = next(d for d in of_kind(docs, "Deployment") if not d["metadata"]["name"].endswith("-gateway"))
    container = pod_spec(deployment)["containers"][0]
    assert container["command"] == ["rl-controlplane", "--config", "/etc/rl-controlplane/config.yaml"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(mounted_config(docs, deployment))
    for name in [n for n in os.environ if n.startswith("RLCP_")]:
        monkeypatch.delenv(name)
    for name, value in _env_of(container).items():
        monkeypatch.setenv(name, value)

    settings = load_controller_settings(config_file)
    assert isinstance(settings, ControllerSettings)
    assert settings.api.host == "0.0.0.0" and settings.api.port == 8080
    assert settings.api.token_file == Path("/var/run/secrets/rl-controlplane/api/token")
    assert settings.workers.token_file == Path("/var/run/secrets/rl-controlplane/workers/token")
    if settings.discovery.kind == "kubernetes":
        k = settings.discovery.kubernetes
        assert k is not None and k.label_selector
        assert k.namespace == ("rl-fleet" if values and "remote" in values.name else NAMESPACE)
    if settings.leader_election.enabled:
        assert settings.leader_election.identity == "pod-0"
        assert settings.leader_election.namespace == NAMESPACE
    if settings.store.kind == "configmap":
        assert settings.store.namespace == NAMESPACE
        role = one(docs, "Role", FULLNAME)
        names = (settings.store.configmap_name, *(f"{settings.store.configmap_name}-{n}" for n in settings.fleets))
        assert ("", "configmaps", names, ("get", "update")) in rules(role)
    if values and values.name == "fleets-values.yaml":
        assert {n: (f.selector, f.models) for n, f in settings.fleets.items()} == {
            "teacher": ("role=teacher", []),
            "reward": ("role=reward", ["rm-v1"]),
        }


def test_the_schema_takes_every_flavor_and_listing_format_the_controller_does() -> None:
    """values.schema.json names them by hand: a flavor the controller gained is refused by helm
    until the schema has it too."""
    discovery = json.loads((CHART / "values.schema.json").read_text())["properties"]["discovery"]["properties"]
    listing = discovery["httpListing"]["properties"]
    assert set(discovery["static"]["items"]["properties"]["flavor"]["enum"]) == FLAVORS
    assert set(listing["default_flavor"]["enum"]) == FLAVORS
    assert listing["format"]["enum"] == list(get_args(ListingFormat))


@pytest.mark.parametrize(("field", "value"), [("default_flavor", "vllm"), ("inference_url", "http://frontend:8000/v1")])
def test_the_schema_refuses_a_flavor_or_inference_url_with_an_sglang_router_listing(
    helm: str, field: str, value: str
) -> None:
    """The controller refuses them at start (a router's workers are flavor sglang, each taking
    inference on its own URL): helm refuses them before any pod is made."""
    listing = {"url": "http://router.rl:30000/workers", "format": "sglang_router", field: value}
    with pytest.raises(ValidationError, match=f"{field} cannot be set with format sglang_router"):
        HttpListingSettings.model_validate(listing)
    sets = ["discovery.kind=http_listing", *(f"discovery.httpListing.{k}={v}" for k, v in listing.items())]
    done = _template(helm, *(arg for s in sets for arg in ("--set", s)))
    assert done.returncode != 0, f"accepted {sets}"
    assert f"discovery.httpListing.{field}: Must not validate the schema" in done.stderr


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        ({"format": "sglang_router"}, ("sglang_router", "dynamo")),  # slime's router: members of flavor sglang
        ({"default_flavor": "sglang"}, ("rl_workers", "sglang")),
    ],
    ids=["sglang_router", "default_flavor_sglang"],
)
def test_an_http_listing_of_sglang_servers_renders_a_config_the_controller_loads(
    helm: str, listing: dict[str, str], expected: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "http://router.rl:30000/workers"
    sets = ["discovery.kind=http_listing", f"discovery.httpListing.url={url}"]
    sets += [f"discovery.httpListing.{k}={v}" for k, v in listing.items()]
    docs = render(helm, *(arg for s in sets for arg in ("--set", s)))
    deployment = next(d for d in of_kind(docs, "Deployment") if not d["metadata"]["name"].endswith("-gateway"))
    config_file = tmp_path / "config.yaml"
    config_file.write_text(mounted_config(docs, deployment))
    for name in [n for n in os.environ if n.startswith("RLCP_")]:
        monkeypatch.delenv(name)
    for name, value in _env_of(pod_spec(deployment)["containers"][0]).items():
        monkeypatch.setenv(name, value)
    http_listing = load_controller_settings(config_file).discovery.http_listing
    assert http_listing is not None
    assert (http_listing.url, http_listing.format, http_listing.default_flavor) == (url, *expected)


def test_rendered_agent_config_loads_in_the_agent_settings(
    helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(helm, "--values", str(CHART / "ci" / "ha-agents-values.yaml"))
    statefulset = one(docs, "StatefulSet")
    container = pod_spec(statefulset)["containers"][0]
    assert container["command"] == ["rl-agent", "--config", "/etc/rl-controlplane/config.yaml"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(mounted_config(docs, statefulset))
    for name in [n for n in os.environ if n.startswith("RLAGENT_")]:
        monkeypatch.delenv(name)
    for name, value in _env_of(container).items():
        if name.startswith("RLAGENT_"):
            monkeypatch.setenv(name, value)

    settings = load_agent_settings(config_file)
    assert isinstance(settings, AgentSettings)
    assert settings.agent_id == "pod-0"
    assert (settings.admin.host, settings.admin.port) == ("0.0.0.0", 8101)
    assert (settings.inference.host, settings.inference.port) == ("0.0.0.0", 8100)
    assert settings.require_desired_version is True
    assert settings.engine.tensor_parallel_size == 2
    assert settings.timeouts.weight_load_s == 900
    assert settings.allowed_roots == [Path("/weights")]


def test_the_gateway_runs_in_the_controller_pod_or_as_its_own_replicas(
    helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(helm)
    controller = one(docs, "Deployment")
    ports = {p["name"]: p["containerPort"] for p in pod_spec(controller)["containers"][0]["ports"]}
    assert ports == {"http": 8080, "gateway": 8090}
    service = one(docs, "Service", f"{FULLNAME}-gateway")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "controller"
    assert service["spec"]["ports"][0]["targetPort"] == "gateway"

    docs = render(helm, "-f", str(CHART / "ci" / "standalone-gateway-values.yaml"))
    controller = one(docs, "Deployment", FULLNAME)
    assert "gateway" not in {p["name"] for p in pod_spec(controller)["containers"][0]["ports"]}
    gateway = one(docs, "Deployment", f"{FULLNAME}-gateway")
    assert gateway["spec"]["replicas"] == 3
    container = pod_spec(gateway)["containers"][0]
    assert container["command"] == ["rl-gateway", "--config", "/etc/rl-controlplane/config.yaml"]
    assert pod_spec(gateway)["automountServiceAccountToken"] is False
    service = one(docs, "Service", f"{FULLNAME}-gateway")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "gateway"
    # The replicas read the controller's config: the gateway section, following the controller's Service.
    config_file = tmp_path / "config.yaml"
    config_file.write_text(mounted_config(docs, gateway))
    for name in [n for n in os.environ if n.startswith("RLCP_")]:
        monkeypatch.delenv(name)
    for name, value in _env_of(container).items():
        monkeypatch.setenv(name, value)
    g = load_controller_settings(config_file).gateway
    assert g.enabled and g.port == 8090 and g.hold_timeout_s == 60 and g.follow_url == f"http://{FULLNAME}:8080"

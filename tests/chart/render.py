"""The chart rendered by helm (`render`) and read back: documents by kind and name, a workload's
pod spec, a Role's rules; the chart's paths and the release's names."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rl-controlplane"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE, NAMESPACE = "rlcp", "rl"
FULLNAME = "rlcp-rl-controlplane"
AGENTS_ON = ["--set", "agents.enabled=true", "--set", "agents.weights.claimName=rl-weights"]


Doc = dict[str, Any]


def _template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def render(helm: str, *args: str) -> list[Doc]:
    done = _template(helm, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, (
        f"{len(found)} {kind} named {name!r}: {[d['metadata']['name'] for d in of_kind(docs, kind)]}"
    )
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    return workload["spec"]["template"]["spec"]


def rules(role: Doc) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    return sorted(
        (apigroup, resource, tuple(r.get("resourceNames", ())), tuple(r["verbs"]))
        for r in role["rules"]
        for apigroup in r["apiGroups"]
        for resource in r["resources"]
    )


def mounted_config(docs: list[Doc], workload: Doc) -> str:
    """The config.yaml the workload's container reads (--config), from the ConfigMap behind it."""
    spec = pod_spec(workload)
    path = spec["containers"][0]["command"][2]
    directory, filename = path.rsplit("/", 1)
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == directory)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return one(docs, "ConfigMap", volume["configMap"]["name"])["data"][filename]

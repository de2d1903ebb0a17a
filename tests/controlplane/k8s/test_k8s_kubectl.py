"""kubectl, an independent client, against the fake API server: it must see what our client
sees. If the fake bent the protocol to suit kubernetes_asyncio (discovery documents, list
shape, label selectors, the watch stream's framing), kubectl would disagree or fail here.

The binary: `.tools/bin/kubectl` (pinned, from scripts/k8s-tools.sh) when present, else the
machine image's /usr/bin/kubectl, else one on PATH. None at all fails the test: a skipped
independent check would look like a passing one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from rlcp.controlplane.discovery.kubernetes import EndpointSliceSource
from rlcp.controlplane.settings.discovery import KubernetesDiscoverySettings
from tests.support.k8s import NS, api_client, wait_for
from tests.support.k8s_fake import FakeKubeApi, endpoint, endpoint_slice

pytestmark = pytest.mark.timeout(90)
REPO = Path(__file__).resolve().parents[3]
SELECTOR = "kubernetes.io/service-name=rl-workers"


def kubectl_binary() -> str:
    for candidate in (REPO / ".tools" / "bin" / "kubectl", Path("/usr/bin/kubectl")):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail(
            "no kubectl: run `bash scripts/k8s-tools.sh` (installs .tools/bin/kubectl) or install one "
            "on PATH; this test is the independent check of the fake API server and must not be skipped"
        )
    return found


async def kubectl(fake: FakeKubeApi, tmp_path: Path, *args: str, timeout_s: float = 30) -> Any:
    # An empty HOME: no kubeconfig, no cache from elsewhere; --server says where to go.
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin"), "KUBECONFIG": "/dev/null"}
    proc = await asyncio.create_subprocess_exec(
        kubectl_binary(),
        f"--server={fake.url}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed ({proc.returncode}): {err.decode()[-2000:]}"
    return json.loads(out)


def ready_workers(slices: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> admin URL, computed independently of our code from kubectl's JSON."""
    out = {}
    for sl in slices:
        port = next((p["port"] for p in sl.get("ports") or [] if p.get("name") == "admin"), None)
        for ep in sl.get("endpoints") or []:
            if port is not None and (ep.get("conditions") or {}).get("ready", True):
                out[ep["targetRef"]["name"]] = f"http://{ep['addresses'][0]}:{port}"
    return out


async def test_kubectl_lists_what_the_client_sees(fake: FakeKubeApi, tmp_path: Path) -> None:
    fake.put(
        endpoint_slice(
            "rl-workers-a",
            [endpoint("w-0", "10.0.0.1", namespace=NS), endpoint("w-1", "10.0.0.2", ready=False, namespace=NS)],
            namespace=NS,
        )
    )
    fake.put(
        endpoint_slice(
            "rl-workers-b", [endpoint("w-2", "10.0.1.1", ready=None, namespace=NS)], ports={"admin": 9000}, namespace=NS
        )
    )
    fake.put(
        endpoint_slice(
            "other",
            [endpoint("x-0", "10.9.0.1", namespace=NS)],
            namespace=NS,
            labels={"kubernetes.io/service-name": "other"},
        )
    )
    fake.put(endpoint_slice("elsewhere", [endpoint("y-0", "10.8.0.1")], namespace="default"))

    api = await api_client(fake)
    try:
        source = EndpointSliceSource(
            api=api,
            settings=KubernetesDiscoverySettings(namespace=NS, label_selector=SELECTOR, read_pods=False),
            request_timeout_s=2,
        )
        async with aclosing(source.watch()) as gen:
            ours = {s.id: s.admin_url for s in await anext(gen)}
    finally:
        await api.close()

    listed = await kubectl(fake, tmp_path, "get", "endpointslices", "-n", NS, "-l", SELECTOR, "-o", "json")
    assert sorted(item["metadata"]["name"] for item in listed["items"]) == ["rl-workers-a", "rl-workers-b"]
    assert ready_workers(listed["items"]) == ours == {"w-0": "http://10.0.0.1:8101", "w-2": "http://10.0.1.1:9000"}
    everything = await kubectl(fake, tmp_path, "get", "endpointslices", "-n", NS, "-o", "json")
    assert sorted(item["metadata"]["name"] for item in everything["items"]) == ["other", "rl-workers-a", "rl-workers-b"]
    one = await kubectl(fake, tmp_path, "get", "endpointslice", "rl-workers-b", "-n", NS, "-o", "json")
    assert (
        one["metadata"]["resourceVersion"]
        == fake.get("endpointslices", NS, "rl-workers-b")["metadata"]["resourceVersion"]
    )


async def test_kubectl_watch_reads_the_fakes_event_stream(fake: FakeKubeApi, tmp_path: Path) -> None:
    fake.put(endpoint_slice("rl-workers-a", [endpoint("w-0", "10.0.0.1", namespace=NS)], namespace=NS))
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin"), "KUBECONFIG": "/dev/null"}
    proc = await asyncio.create_subprocess_exec(
        kubectl_binary(),
        f"--server={fake.url}",
        "get",
        "endpointslices",
        "-n",
        NS,
        "-l",
        SELECTOR,
        "--watch",
        "--output-watch-events",
        "-o",
        "json",
        "--request-timeout=60s",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    decoder, buffer, events = json.JSONDecoder(), "", []

    async def read_events(n: int) -> None:
        nonlocal buffer
        while len(events) < n:
            chunk = await proc.stdout.read(65536)
            assert chunk, f"kubectl ended early: {(await proc.stderr.read()).decode()[-2000:]}"
            buffer += chunk.decode()
            while buffer.strip():
                try:
                    doc, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # an object split across reads: wait for the rest
                events.append(doc)
                buffer = buffer.lstrip()[end:]

    try:
        await asyncio.wait_for(read_events(1), 30)  # the initial state
        await wait_for(lambda: fake.watchers, what="kubectl's watch to open")
        fake.put(
            endpoint_slice(
                "rl-workers-a",
                [endpoint("w-0", "10.0.0.1", namespace=NS), endpoint("w-1", "10.0.0.2", namespace=NS)],
                namespace=NS,
            )
        )
        fake.remove("endpointslices", NS, "rl-workers-a")
        await asyncio.wait_for(read_events(3), 30)
    finally:
        proc.kill()
        await proc.wait()
    assert [e["type"] for e in events[:3]] == ["ADDED", "MODIFIED", "DELETED"]
    assert [ep["targetRef"]["name"] for ep in events[1]["object"]["endpoints"]] == ["w-0", "w-1"]
    assert all(e["object"]["kind"] == "EndpointSlice" for e in events[:3])

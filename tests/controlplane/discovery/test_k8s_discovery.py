"""EndpointSlice discovery with the real client (kubernetes_asyncio) against the wire-level
fake API server: membership follows endpoints added, removed and turning unready; a watch
compaction (410, as an ERROR event or an HTTP 410) re-lists without losing or duplicating a
worker, changes made during the gap included; bookmarks let a resumed watch skip the re-list;
ports by name; world size from the pod or the slice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from rlcp.controlplane.discovery.base import Membership
from rlcp.controlplane.discovery.kubernetes import EndpointSliceSource, members_from_slices
from rlcp.controlplane.settings.discovery import KubernetesDiscoverySettings
from rlcp.controlplane.workerspec import WorkerSpec
from tests.support.k8s import NS, api_client, wait_for
from tests.support.k8s_fake import FakeKubeApi, endpoint, endpoint_slice, pod

pytestmark = pytest.mark.timeout(60)
SELECTOR = "kubernetes.io/service-name=rl-workers"


def settings(**kw: Any) -> KubernetesDiscoverySettings:
    return KubernetesDiscoverySettings(
        **({"namespace": NS, "label_selector": SELECTOR, "watch_timeout_s": 30, "backoff_max_s": 0.5} | kw)
    )


class Follower:
    """Runs a source in a task, as the controller's discovery loop does, and keeps every list."""

    def __init__(self, source: EndpointSliceSource) -> None:
        self.source = source
        self.lists: list[list[WorkerSpec]] = []
        self.membership = Membership()
        self.task = asyncio.create_task(self._run(), name="test-discovery")

    async def _run(self) -> None:
        async with aclosing(self.source.watch()) as gen:
            async for specs in gen:
                self.lists.append(specs)
                self.membership.apply(specs)

    @property
    def ids(self) -> list[str] | None:
        return [s.id for s in self.lists[-1]] if self.lists else None

    async def wait_ids(self, ids: list[str], what: str = "") -> list[WorkerSpec]:
        await wait_for(lambda: self.ids == ids, what=f"members {ids} {what}".strip())
        return self.lists[-1]

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def follow(fake: FakeKubeApi) -> AsyncIterator[Any]:
    started: list[tuple[Follower, client.ApiClient]] = []

    async def start(request_timeout_s: float = 2, **kw: Any) -> Follower:
        api = await api_client(fake)
        f = Follower(
            EndpointSliceSource(
                api=api, settings=settings(**kw), request_timeout_s=request_timeout_s, backoff_initial_s=0.05
            )
        )
        started.append((f, api))
        return f

    yield start
    for f, api in started:
        await f.stop()
        await api.close()


def put_slice(fake: FakeKubeApi, name: str, *eps: dict[str, Any], **kw: Any) -> None:
    fake.put(endpoint_slice(name, list(eps), namespace=NS, **kw))


def ep(podname: str, ip: str, **kw: Any) -> dict[str, Any]:
    return endpoint(podname, ip, namespace=NS, **kw)


# -- membership follows the slices ------------------------------------------------------------------


async def test_endpoints_added_removed_and_unready_change_membership(fake: FakeKubeApi, follow: Any) -> None:
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2", ready=False))
    put_slice(fake, "other-service", ep("x-0", "10.9.0.1"), labels={"kubernetes.io/service-name": "other"})
    f = await follow()
    [w0] = await f.wait_ids(["w-0"], "after the list")  # unready w-1 and the other service are out
    assert w0 == WorkerSpec(
        id="w-0", admin_url="http://10.0.0.1:8101", inference_url="http://10.0.0.1:8100", flavor="agent", world_size=1
    )

    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2", ready=True))
    await f.wait_ids(["w-0", "w-1"], "once w-1 is ready")
    put_slice(fake, "rl-workers-b", ep("w-2", "10.0.1.1", ready=None))  # no `ready`: ready, as in Kubernetes
    await f.wait_ids(["w-0", "w-1", "w-2"], "after a new slice")
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1", ready=False), ep("w-1", "10.0.0.2"))
    await f.wait_ids(["w-1", "w-2"], "once w-0 turns unready")
    fake.remove("endpointslices", NS, "rl-workers-b")
    await f.wait_ids(["w-1"], "after the slice is deleted")
    # A slice relabelled out of the selector leaves as a DELETED event.
    put_slice(fake, "rl-workers-a", ep("w-1", "10.0.0.2"), labels={"kubernetes.io/service-name": "other"})
    await f.wait_ids([], "after the relabel")
    put_slice(fake, "rl-workers-a", ep("w-1", "10.0.0.9"))
    [w1] = await f.wait_ids(["w-1"], "after the relabel back")
    assert w1.admin_url == "http://10.0.0.9:8101"

    # Every yielded list is complete and has no duplicate ids; epochs moved once per change.
    assert all(len({s.id for s in lst}) == len(lst) for lst in f.lists)
    assert f.membership.epoch == len(f.lists)
    assert fake.count("GET", "/endpointslices", watch=False) == 1  # one list, then watch only


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
async def test_compaction_relists_without_losing_or_duplicating(
    fake: FakeKubeApi, follow: Any, gone_as_http: bool
) -> None:
    fake.gone_as_http = gone_as_http
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2"))
    put_slice(fake, "rl-workers-b", ep("w-2", "10.0.1.1"))
    with capture_logs() as logs:
        f = await follow()
        await f.wait_ids(["w-0", "w-1", "w-2"])
        put_slice(fake, "rl-workers-b", ep("w-2", "10.0.1.1"), ep("w-3", "10.0.1.2"))
        await f.wait_ids(["w-0", "w-1", "w-2", "w-3"], "from a watch event")
        lists_before = len(f.lists)

        # The gap: the watch is cut, and while no watch is open a worker goes away, one
        # moves, one turns unready, and one arrives; then history is compacted past them all.
        fake.hold_watches()
        await wait_for(lambda: not fake.watchers, what="the watch to close")
        put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1", ready=False), ep("w-1", "10.0.0.7"))
        put_slice(fake, "rl-workers-b", ep("w-3", "10.0.1.2"), ep("w-4", "10.0.1.3"))
        fake.compact()
        fake.release_watches()

        specs = await f.wait_ids(["w-1", "w-3", "w-4"], "after the re-list")
    assert {s.id: s.admin_url for s in specs} == {
        "w-1": "http://10.0.0.7:8101",
        "w-3": "http://10.0.1.2:8101",
        "w-4": "http://10.0.1.3:8101",
    }
    assert any(e["event"] == "endpointslice_watch_expired" and "410" in e["reason"] for e in logs), logs
    assert fake.count("GET", "/endpointslices", watch=False) == 2  # exactly one re-list
    # The re-list yielded the complete new list at once: nothing lost, nothing doubled.
    assert [[s.id for s in lst] for lst in f.lists[lists_before:]] == [["w-1", "w-3", "w-4"]]

    put_slice(fake, "rl-workers-b", ep("w-3", "10.0.1.2"))  # and the new watch is live
    await f.wait_ids(["w-1", "w-3"], "from the watch after the re-list")


async def test_bookmarks_move_the_resume_point_so_no_relist_is_needed(fake: FakeKubeApi, follow: Any) -> None:
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"))
    f = await follow()
    await f.wait_ids(["w-0"])
    await wait_for(lambda: fake.watchers, what="the watch to open")
    # Changes the watch does not select move the version without sending the client an event;
    # only a BOOKMARK tells it how far it has seen.
    for i in range(5):
        fake.put({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": f"noise-{i}", "namespace": NS}})
    noise_rv = fake.rv
    watches_before = fake.count("GET", "/endpointslices", watch=True)
    await wait_for(lambda: any(rv >= noise_rv for rv in fake.bookmarks_sent), what="a bookmark past the noise")
    fake.hold_watches()
    await wait_for(lambda: not fake.watchers, what="the watch to close")
    fake.compact()  # compacted at noise_rv: a client that saw the bookmark resumes at it, no 410
    fake.release_watches()
    await wait_for(
        lambda: fake.count("GET", "/endpointslices", watch=True) > watches_before, what="the watch to resume"
    )
    resumed_from = int(_resume_point(fake) or 0)
    assert resumed_from >= noise_rv, "the client resumed from before the bookmark"
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2"))
    await f.wait_ids(["w-0", "w-1"], "from the resumed watch")
    assert fake.count("GET", "/endpointslices", watch=False) == 1  # never re-listed


def _resume_point(fake: FakeKubeApi) -> str | None:
    watches = [r for r in fake.requests if r.query.get("watch") in ("true", "True") and "endpointslices" in r.path]
    return watches[-1].query.get("resourceVersion") if watches else None


# -- ports, world size, addresses ----------------------------------------------------------------------


async def test_ports_by_name_and_world_size_from_pod_or_slice(fake: FakeKubeApi, follow: Any) -> None:
    key = "rlcp.io/world-size"
    fake.put(pod("w-0", annotations={key: "4"}, namespace=NS))
    fake.put(pod("w-1", labels={key: "2"}, namespace=NS))
    fake.put(pod("w-2", namespace=NS))  # nothing on the pod: the slice's value counts
    fake.put(pod("w-3", annotations={key: "many"}, namespace=NS))  # invalid: logged, slice's value
    # Port numbers differ per slice and are found by name, in any order, among other ports.
    put_slice(
        fake,
        "rl-workers-a",
        ep("w-0", "10.0.0.1"),
        ep("w-1", "10.0.0.2"),
        ports={"metrics": 9100, "inference": 8000, "admin": 9000},
    )
    put_slice(
        fake,
        "rl-workers-b",
        ep("w-2", "10.0.1.1"),
        ep("w-3", "10.0.1.2"),
        ports={"admin": 9001, "http": 8001},
        annotations={key: "8"},
    )
    put_slice(fake, "rl-workers-c", ep("w-9", "10.0.2.1"), ports={"http": 80})  # no admin port: skipped
    with capture_logs() as logs:
        f = await follow()
        specs = await f.wait_ids(["w-0", "w-1", "w-2", "w-3"])
    by_id = {s.id: s for s in specs}
    assert (by_id["w-0"].admin_url, by_id["w-0"].inference_url) == ("http://10.0.0.1:9000", "http://10.0.0.1:8000")
    assert (by_id["w-2"].admin_url, by_id["w-2"].inference_url) == ("http://10.0.1.1:9001", None)
    assert {i: s.world_size for i, s in by_id.items()} == {"w-0": 4, "w-1": 2, "w-2": 8, "w-3": 8}
    skipped = [e for e in logs if e["event"] == "endpointslice_entry_skipped"]
    assert len(skipped) == 1 and "rl-workers-c" in skipped[0]["reason"] and "'admin'" in skipped[0]["reason"]
    assert any(e["event"] == "pod_world_size_invalid" and e["pod"] == "w-3" for e in logs)

    # One GET per pod: further events do not read the pods again.
    reads = fake.count("GET", f"/namespaces/{NS}/pods/")
    assert reads == 4
    put_slice(
        fake, "rl-workers-a", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2"), ep("w-5", "10.0.0.5"), ports={"admin": 9000}
    )
    await f.wait_ids(["w-0", "w-1", "w-2", "w-3", "w-5"])
    assert fake.count("GET", f"/namespaces/{NS}/pods/") == reads + 1  # only the new pod (not found: size 1)
    assert f.lists[-1][-1].world_size == 1

    # A pod recreated under the same name (a StatefulSet) is a new uid: read again.
    new = pod("w-0", annotations={key: "2"}, namespace=NS)
    new["metadata"]["uid"] = "uid-w-0-again"
    fake.remove("pods", NS, "w-0")
    fake.put(new)
    moved = ep("w-0", "10.0.0.8")
    moved["targetRef"]["uid"] = "uid-w-0-again"
    put_slice(fake, "rl-workers-a", moved, ep("w-1", "10.0.0.2"), ep("w-5", "10.0.0.5"), ports={"admin": 9000})
    await wait_for(lambda: f.lists[-1][0].admin_url == "http://10.0.0.8:9000", what="w-0 moved")
    assert f.lists[-1][0].world_size == 2


async def test_without_pod_reads_the_slice_decides(fake: FakeKubeApi, follow: Any) -> None:
    fake.put(pod("w-0", annotations={"rlcp.io/world-size": "4"}, namespace=NS))
    put_slice(
        fake,
        "rl-workers-a",
        ep("w-0", "10.0.0.1"),
        labels={"kubernetes.io/service-name": "rl-workers", "rlcp.io/world-size": "2"},
    )
    f = await follow(read_pods=False)
    [w0] = await f.wait_ids(["w-0"])
    assert w0.world_size == 2
    assert fake.count("GET", "/pods/") == 0


def _slice(name: str, address_type: str, *eps: dict[str, Any], **kw: Any) -> client.V1EndpointSlice:
    from kubernetes_asyncio.client import ApiClient

    raw = endpoint_slice(name, list(eps), address_type=address_type, namespace=NS, **kw)
    # The library's own deserializer, exactly as a list or watch would hand it over.
    return ApiClient().deserialize(type("R", (), {"data": __import__("json").dumps(raw)})(), "V1EndpointSlice")


async def test_members_from_slices_dedupes_and_formats_addresses() -> None:
    s = settings(scheme="https")
    v4 = _slice("b-v4", "IPv4", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2"))
    v6 = _slice("a-v6", "IPv6", ep("w-0", "fd00::1"), ep("w-2", "fd00::2"))
    again = _slice("c-v4", "IPv4", ep("w-1", "10.0.0.3"))  # a pod in two slices while they rebalance
    no_ref = _slice("d-v4", "IPv4", {"addresses": ["10.0.0.9"], "conditions": {}, "hostname": "static-0"})
    members, problems = members_from_slices([again, v6, v4, no_ref], s, {"w-2": 3})
    assert problems == []
    assert [(m.id, m.admin_url, m.world_size) for m in members] == [
        ("static-0", "https://10.0.0.9:8101", 1),
        ("w-0", "https://10.0.0.1:8101", 1),  # IPv4 preferred over the IPv6 slice
        ("w-1", "https://10.0.0.2:8101", 1),  # first slice by name wins, deterministically
        ("w-2", "https://[fd00::2]:8101", 3),
    ]
    _, problems = members_from_slices(
        [_slice("e", "IPv4", ep("w", "1.1.1.1"), annotations={"rlcp.io/world-size": "0"})], s, {}
    )
    assert len(problems) == 1 and "rlcp.io/world-size='0'" in problems[0] and "EndpointSlice e" in problems[0]


async def test_api_failures_back_off_then_recover(fake: FakeKubeApi, follow: Any) -> None:
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"))
    refusal = fake.refuse(lambda r: r.path.endswith("/endpointslices"), status=503)
    with capture_logs() as logs:
        f = await follow()
        await wait_for(
            lambda: sum(e["event"] == "endpointslice_watch_failed" for e in logs) >= 2, what="two failed lists"
        )
        assert f.lists == []  # a failing API yields nothing: the last membership stands
        fake.refusals.remove(refusal)
        await f.wait_ids(["w-0"], "after the API recovers")
    failed = [e for e in logs if e["event"] == "endpointslice_watch_failed"]
    assert "503" in failed[0]["reason"] and "list EndpointSlices in rl" in failed[0]["reason"]
    assert [e["failures"] for e in failed[:2]] == [1, 2]


async def test_a_watch_that_hangs_is_given_up_and_resumed(fake: FakeKubeApi, follow: Any) -> None:
    """The server never ends the watch nor sends a byte: the client's deadline (watch timeout +
    request timeout) ends it, and the source resumes from where it was, without a re-list."""
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"))
    refusal = fake.refuse(lambda r: r.query.get("watch") == "True", mode="hang")
    f = await follow(watch_timeout_s=1, request_timeout_s=0.5)
    await f.wait_ids(["w-0"])
    await wait_for(
        lambda: fake.count("GET", "/endpointslices", watch=True) >= 2,
        timeout_s=20,
        what="the hung watch to be given up and retried",
    )
    fake.refusals.remove(refusal)
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2"))
    await f.wait_ids(["w-0", "w-1"], "from a resumed watch")
    assert fake.count("GET", "/endpointslices", watch=False) == 1


async def test_members_carry_their_pods_labels(fake: FakeKubeApi, follow: Any) -> None:
    """The pod read that gives the world size also gives the member its labels (no watch on
    pods); a pod recreated with other labels is a new uid, read again; without pod reads there
    are none."""
    fake.put(pod("w-0", labels={"role": "policy", "app.kubernetes.io/name": "vllm"}, namespace=NS))
    fake.put(pod("w-1", labels={"role": "reference"}, namespace=NS))
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"), ep("w-1", "10.0.0.2"), ports={"admin": 9000})
    f = await follow()
    specs = await f.wait_ids(["w-0", "w-1"])
    assert {s.id: dict(s.labels) for s in specs} == {
        "w-0": {"role": "policy", "app.kubernetes.io/name": "vllm"},
        "w-1": {"role": "reference"},
    }

    new = pod("w-1", labels={"role": "policy"}, namespace=NS)
    new["metadata"]["uid"] = "uid-w-1-again"
    fake.remove("pods", NS, "w-1")
    fake.put(new)
    moved = ep("w-1", "10.0.0.2")
    moved["targetRef"]["uid"] = "uid-w-1-again"
    put_slice(fake, "rl-workers-a", ep("w-0", "10.0.0.1"), moved, ports={"admin": 9000})
    await wait_for(lambda: dict(f.lists[-1][1].labels) == {"role": "policy"}, what="w-1's new labels")

    blind = await follow(read_pods=False)
    specs = await blind.wait_ids(["w-0", "w-1"])
    assert all(dict(s.labels) == {} for s in specs)

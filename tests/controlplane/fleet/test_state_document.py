"""The state document made piecewise (`fleet/view.py`): each member's view and JSON are made
again only when its record or the desired state changed, and the document spliced from them
is, byte for byte, what serializing the whole state gives. The registry is the real one; its
records are fed status reads and results as the observer and operations feed them."""

from __future__ import annotations

from collections import Counter

import pytest

from rlcp.controlplane.fleet import view as view_module
from rlcp.controlplane.fleet.changes import ChangeCounter
from rlcp.controlplane.fleet.members import FleetRegistry
from rlcp.controlplane.fleet.view import FleetFacts, StateCache, WorkerViews, build_state
from rlcp.controlplane.workers.fanout import Outcome
from rlcp.controlplane.workerspec import WorkerSpec, WorkerStatus
from rlcp.core.wire.agent.state import RequestCounts
from rlcp.core.wire.controller import DesiredState, WorkerResult


def seen(registry: FleetRegistry, wid: str, version: str | None, *, ok: bool = True) -> None:
    status = WorkerStatus(
        paused=False,
        weight_version=version,
        ready=True,
        instance_id="a",
        requests=RequestCounts(running=1, waiting=0, frozen=0),
    )
    result = WorkerResult(
        worker_id=wid, status="ok" if ok else "error", phase="status", message=None if ok else "connection refused"
    )
    registry.observe(Outcome(wid, result, status if ok else None))


@pytest.fixture
def counted_registry(monkeypatch: pytest.MonkeyPatch):
    """Four members seen at v1, and how many times each one's view was made."""
    made = Counter()
    real = view_module.worker_view

    def counting(desired, rec):
        made[rec.id] += 1
        return real(desired, rec)

    monkeypatch.setattr(view_module, "worker_view", counting)
    changes = ChangeCounter()
    registry = FleetRegistry(make_driver=lambda spec: object(), changes=changes)
    registry.apply([WorkerSpec(id=f"w{i}", admin_url=f"http://127.0.0.1:{9000 + i}") for i in range(4)])
    for i in range(4):
        seen(registry, f"w{i}", "v1")
    return registry, changes, made


def document(registry: FleetRegistry, views: WorkerViews, desired: DesiredState):
    members = registry.members()
    return build_state(
        FleetFacts(
            desired=desired,
            members=members,
            views=views.views(desired, members),
            membership_epoch=1,
            discovery_synced=True,
            phase=None,
            operation=None,
            verified=True,
            transfer=None,
        )
    )


def test_only_changed_members_are_made_again_and_the_splice_is_the_whole_serialization(counted_registry) -> None:
    registry, changes, made = counted_registry
    views, desired = WorkerViews(), DesiredState(weight_version="v1")
    cache = StateCache(changes, lambda: document(registry, views, desired), views.json)
    first = cache.json()
    assert first == document(registry, views, desired).model_dump_json().encode()
    assert made == {"w0": 1, "w1": 1, "w2": 1, "w3": 1}

    seen(registry, "w2", "v2")  # one status read
    registry.record_result(WorkerResult(worker_id="w0", status="ok", phase="resume"))  # one operation step
    second = cache.json()
    assert made == {"w0": 2, "w1": 1, "w2": 2, "w3": 1}
    assert second == document(registry, views, desired).model_dump_json().encode() and second != first
    assert b"\"not_ready_reason\":\"at weight version 'v2', desired 'v1'\"" in second

    seen(registry, "w3", None, ok=False)  # unreachable
    third = cache.json()
    assert made["w3"] == 2 and b'"last_error":"connection refused"' in third
    assert third == document(registry, views, desired).model_dump_json().encode()


def test_a_new_desired_state_or_a_replaced_member_remakes_them(counted_registry) -> None:
    registry, changes, made = counted_registry
    views = WorkerViews()
    document(registry, views, DesiredState(weight_version="v1"))
    state = document(registry, views, DesiredState(weight_version="v2"))  # a new desired object
    assert made == {"w0": 2, "w1": 2, "w2": 2, "w3": 2}
    assert not any(w.ready for w in state.workers)
    # A member whose spec changed is a new record, even at the same revision.
    registry.apply([WorkerSpec(id=f"w{i}", admin_url=f"http://127.0.0.1:{9100 + i}") for i in range(4)])
    state = document(registry, views, DesiredState(weight_version="v2"))
    assert [w.admin_url for w in state.workers] == [f"http://127.0.0.1:{9100 + i}" for i in range(4)]
    assert not any(w.reachable for w in state.workers)


def test_the_cache_tags_each_generation_and_compresses_it_once(
    counted_registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gzip

    registry, changes, _ = counted_registry
    views, desired = WorkerViews(), DesiredState(weight_version="v1")
    cache = StateCache(changes, lambda: document(registry, views, desired), views.json)
    tag = cache.etag()
    body = cache.body()
    assert body.etag == tag and body.data == cache.json() and gzip.decompress(body.gzipped()) == body.data
    assert cache.etag() == tag and cache.body() is body  # nothing moved: the same bytes, copy and tag

    compressed = []
    real = gzip.compress
    monkeypatch.setattr(gzip, "compress", lambda *a, **kw: compressed.append(1) or real(*a, **kw))
    seen(registry, "w1", "v2")  # the state changed: a new tag, a new body, compressed once for all readers
    assert cache.etag() != tag
    changed = cache.body()
    assert changed.etag == cache.etag() and changed.data != body.data
    assert all(cache.body().gzipped() == changed.gzipped() for _ in range(5)) and len(compressed) == 1

    # Another cache over the same counter (a restarted controller counts from zero again): other tags.
    again = StateCache(changes, lambda: document(registry, views, desired), views.json)
    assert again.body().data == changed.data and again.etag() != changed.etag

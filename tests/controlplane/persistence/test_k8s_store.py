"""The desired state in a ConfigMap, with the real client against the fake API server:
create when missing, replace guarded by resourceVersion, a conflicting write re-read and
retried only by the leader, loud failures otherwise."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from rlcp.controlplane.api.errors import to_api_error
from rlcp.controlplane.errors import NotLeader, StoreConflict, StoreUnavailable
from rlcp.controlplane.leadership.guard import Leadership
from rlcp.controlplane.persistence.configmap import DATA_KEY, ConfigMapStore
from rlcp.core.wire.controller.desired import DesiredState
from tests.support.k8s import NS, api_client, wait_for
from tests.support.k8s_fake import FakeKubeApi

pytestmark = pytest.mark.timeout(30)
NAME = "rl-controlplane-state"


@pytest.fixture
async def api(fake: FakeKubeApi) -> AsyncIterator[client.ApiClient]:
    api = await api_client(fake)
    yield api
    await api.close()


def store(api: client.ApiClient, leadership: Leadership | None = None) -> ConfigMapStore:
    return ConfigMapStore(
        api=api, name=NAME, namespace=NS, leadership=leadership or Leadership.always("ctl-a"), request_timeout_s=2
    )


def desired(version: str) -> DesiredState:
    return DesiredState.model_validate(
        {"weight_version": version, "weight_source": {"kind": "disk", "path": f"/ckpt/{version}"}}
    )


def stored(fake: FakeKubeApi) -> dict:
    cm = fake.get("configmaps", NS, NAME)
    assert cm is not None
    return json.loads(cm["data"][DATA_KEY])


async def test_round_trip_creates_then_replaces(fake: FakeKubeApi, api: client.ApiClient) -> None:
    s = store(api)
    assert await s.load() is None  # missing: nothing stored yet
    await s.save(desired("v1"))
    assert fake.count("POST", "/configmaps") == 1
    assert stored(fake)["weight_version"] == "v1"
    await s.save(desired("v2"))
    assert fake.count("PUT", f"/configmaps/{NAME}") == 1 and fake.count("POST", "/configmaps") == 1
    # A second controller (a restart) reads what the first wrote.
    again = await store(api).load()
    assert again == desired("v2")
    assert fake.get("configmaps", NS, NAME)["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "rl-controlplane"}


async def test_a_conflicting_write_is_re_read_and_retried_by_the_leader(
    fake: FakeKubeApi, api: client.ApiClient
) -> None:
    s = store(api)
    await s.save(desired("v1"))
    # Someone else (an old leader, a person with kubectl) writes in between.
    cm = fake.get("configmaps", NS, NAME)
    cm["data"][DATA_KEY] = desired("v-other").model_dump_json()
    fake.put(cm)
    with capture_logs() as logs:
        await s.save(desired("v2"))
    assert stored(fake)["weight_version"] == "v2"  # the leader's state wins
    [conflict] = [e for e in logs if e["event"] == "desired_state_write_conflict"]
    assert "409" in conflict["reason"] and f"ConfigMap {NS}/{NAME}" in conflict["reason"]
    assert fake.count("PUT", f"/configmaps/{NAME}") == 2  # the stale write, then the retry

    # Created by someone else between our load (missing) and our save: AlreadyExists, then replace.
    late = store(api)
    fake.remove("configmaps", NS, NAME)
    assert await late.load() is None
    fake.put({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": NAME, "namespace": NS}, "data": {}})
    await late.save(desired("v3"))
    assert stored(fake)["weight_version"] == "v3"


async def test_a_follower_never_writes_and_a_lost_leader_fails_loudly(fake: FakeKubeApi, api: client.ApiClient) -> None:
    follower = Leadership("ctl-b")
    follower.observed("ctl-a")
    with pytest.raises(NotLeader, match="'ctl-a'"):
        await store(api, follower).save(desired("v1"))
    assert fake.count("POST", "/configmaps") == 0 and fake.count("PUT", "/configmaps") == 0

    # Leadership lost between the conflict and the retry: no second write.
    leader = Leadership("ctl-a", leading=True)
    s = store(api, leader)
    await s.save(desired("v1"))
    cm = fake.get("configmaps", NS, NAME)
    fake.put(cm)  # moves the resourceVersion
    refusal = fake.refuse(lambda r: r.method == "GET" and r.path.endswith(NAME), mode="delay")
    saving = asyncio.create_task(s.save(desired("v2")))
    await wait_for(lambda: fake.count("GET", f"/configmaps/{NAME}") >= 1, what="the re-read after the conflict")
    leader.lost(leader="ctl-b", reason="test")
    refusal.until.set()
    with pytest.raises(NotLeader):
        await saving
    assert fake.count("PUT", f"/configmaps/{NAME}") == 1
    assert stored(fake)["weight_version"] == "v1"


async def test_conflicts_that_keep_coming_and_an_unreachable_api_fail_loudly(
    fake: FakeKubeApi, api: client.ApiClient
) -> None:
    s = store(api)
    await s.save(desired("v1"))
    fake.refuse(lambda r: r.method == "PUT", status=409)
    with pytest.raises(StoreConflict) as conflict:
        await s.save(desired("v2"))
    assert (to_api_error(conflict.value).status, to_api_error(conflict.value).code) == (409, "store_conflict")
    assert f"ConfigMap {NS}/{NAME}" in conflict.value.message
    fake.refusals.clear()
    fake.refuse(lambda r: True, status=503)
    with pytest.raises(StoreUnavailable) as down:
        await store(api).load()
    assert to_api_error(down.value).status == 503 and "503" in down.value.message and NAME in down.value.message


async def test_an_unreadable_document_is_refused_not_overwritten(fake: FakeKubeApi, api: client.ApiClient) -> None:
    fake.put(
        {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": NAME, "namespace": NS},
            "data": {DATA_KEY: '{"weight_version": 7, "paused": "sometimes"}'},
        }
    )
    with pytest.raises(ValueError, match=f"ConfigMap {NS}/{NAME}"):
        await store(api).load()

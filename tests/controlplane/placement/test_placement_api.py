"""`GET/PUT /v1/rl/placement` and `rlctl placement|scale` without a Ray cluster: the count is
checked before anything is stored, kept in the desired state (a restarted controller keeps it),
handed back to the settings with null, and refused on a controller that places nothing. The
loop that acts on the count runs against a real Ray head in test_ray_placement.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.assembly import assemble
from rlcp.harness.controller import AUTH, CTL_TOKEN, controller_settings, rlctl

RAY = dict(
    discovery={"kind": "ray", "ray": {"dashboard_url": "http://127.0.0.1:9", "namespace": "rlcp"}},
    placement={"kind": "ray", "ray": {"address": "127.0.0.1:9", "replicas": 2, "max_replicas": 8}},
)


async def client(tmp_path: Path, **overrides: Any) -> TestClient:
    # No background loops: nothing connects to Ray; the API and the desired state are what is tested.
    app = assemble(controller_settings(tmp_path, [], **overrides), token=CTL_TOKEN, background=False)
    c = TestClient(TestServer(app))
    await c.start_server()
    return c


@pytest.fixture
async def placing(tmp_path: Path) -> AsyncIterator[TestClient]:
    c = await client(tmp_path, **RAY)
    yield c
    await c.close()


async def put(c: TestClient, body: Any) -> tuple[int, dict[str, Any]]:
    resp = await c.put("/v1/rl/placement", headers=AUTH, json=body)
    return resp.status, await resp.json()


async def test_scale_is_stored_in_the_desired_state_and_null_hands_it_back(placing: TestClient, tmp_path: Path) -> None:
    resp = await placing.get("/v1/rl/placement", headers=AUTH)
    view = await resp.json()
    assert resp.status == 200
    assert {k: view[k] for k in ("kind", "replicas", "replicas_from", "max_replicas", "placed", "leading")} == {
        "kind": "ray",
        "replicas": 2,
        "replicas_from": "settings",
        "max_replicas": 8,
        "placed": [],
        "leading": True,
    }
    assert view["last_pass_at"] is None  # no loop ran
    status, view = await put(placing, {"replicas": 5})
    assert status == 200 and (view["replicas"], view["replicas_from"]) == (5, "api"), view
    stored = json.loads((tmp_path / "state" / "desired.json").read_text())
    assert stored["placement_replicas"] == 5
    await placing.close()

    again = await client(tmp_path, **RAY)  # a restarted controller over the same store
    try:
        view = await (await again.get("/v1/rl/placement", headers=AUTH)).json()
        assert (view["replicas"], view["replicas_from"]) == (5, "api")
        status, view = await put(again, {"replicas": None})
        assert status == 200 and (view["replicas"], view["replicas_from"]) == (2, "settings"), view
        status, view = await put(again, {"replicas": 0})
        assert status == 200 and (view["replicas"], view["replicas_from"]) == (0, "api"), view
    finally:
        await again.close()


@pytest.mark.parametrize(
    "body",
    [{}, {"replicas": -1}, {"replicas": "three"}, {"replicas": 9}, {"replicas": 2.5}, {"replicas": 2, "extra": 1}, [3]],
)
async def test_a_bad_count_is_a_4xx_naming_the_field_and_stores_nothing(
    placing: TestClient, tmp_path: Path, body: Any
) -> None:
    status, answer = await put(placing, body)
    if isinstance(body, list):
        assert (status, answer["error"]["field"]) == (400, "body"), answer
    else:
        assert (status, answer["error"]["field"]) == (422, "extra" if "extra" in body else "replicas"), answer
    view = await (await placing.get("/v1/rl/placement", headers=AUTH)).json()
    assert (view["replicas"], view["replicas_from"]) == (2, "settings")
    assert (
        not (tmp_path / "state" / "desired.json").exists()
        or json.loads((tmp_path / "state" / "desired.json").read_text()).get("placement_replicas") is None
    )


async def test_scale_needs_the_token(placing: TestClient) -> None:
    resp = await placing.put("/v1/rl/placement", json={"replicas": 3})
    assert resp.status == 401


async def test_a_controller_that_places_nothing_refuses_to_scale(tmp_path: Path) -> None:
    c = await client(tmp_path)
    try:
        view = await (await c.get("/v1/rl/placement", headers=AUTH)).json()
        assert (view["kind"], view["replicas"], view["replicas_from"]) == ("none", None, None)
        status, answer = await put(c, {"replicas": 3})
        assert status == 409 and "placement.kind is none" in answer["error"]["message"], answer
    finally:
        await c.close()


async def test_rlctl_placement_and_scale(sim_fleet: Any) -> None:
    # A controller that places nothing: rlctl shows it and refuses, one line, exit 2.
    rc, out, err = await rlctl(sim_fleet.ctl.url, "placement")
    assert rc == 0 and "placement: none" in out, err
    rc, out, err = await rlctl(sim_fleet.ctl.url, "scale", "3")
    assert rc == 2 and "placement.kind is none" in err and err.count("\n") == 1, err
    rc, out, err = await rlctl(sim_fleet.ctl.url, "scale", "-2")
    assert rc == 2 and "cannot be negative" in err, err

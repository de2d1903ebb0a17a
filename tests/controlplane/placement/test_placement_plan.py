"""Placement's plan (rlcp/controlplane/placement/plan.py) and settings, without Ray: groups of
bundles cover ranges of agent indices; scaling adds a group for the uncovered ones and removes
those starting at or above the new count."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlcp.controlplane.placement.plan import Group, group_name, group_of, parse_actor, parse_group, plan_placement
from rlcp.controlplane.placement.ray import agent_config
from rlcp.controlplane.settings import ControllerSettings
from rlcp.controlplane.settings.placement import RayPlacementSettings


def test_first_pass_places_one_group_and_every_actor() -> None:
    plan = plan_placement(2, set(), set())
    assert plan.create_group == Group(0, 2) and plan.start == [0, 1] and not plan.kill and not plan.remove


def test_nothing_to_do_when_placed() -> None:
    assert plan_placement(2, {0, 1}, {Group(0, 2)}).empty


def test_scale_up_adds_a_group_for_the_new_bundles_only() -> None:
    plan = plan_placement(3, {0, 1}, {Group(0, 2)})
    assert plan.create_group == Group(2, 1) and plan.start == [2]


def test_scale_down_kills_from_the_top_and_keeps_a_straddling_group() -> None:
    plan = plan_placement(1, {0, 1, 2}, {Group(0, 2), Group(2, 1)})
    assert plan.kill == [1, 2] and plan.remove == [Group(2, 1)] and plan.create_group is None and plan.start == []
    # scaling up again reuses the straddling group's spare bundle before adding a group
    again = plan_placement(3, {0}, {Group(0, 2)})
    assert again.create_group == Group(2, 1) and again.start == [1, 2]
    assert group_of(1, {Group(0, 2), Group(2, 1)}) == Group(0, 2)


def test_a_restarting_actor_is_still_there() -> None:
    plan = plan_placement(2, {0}, {Group(0, 2)})  # actor 1 gone for good (killed by hand)
    assert plan.start == [1] and plan.create_group is None


def test_names_round_trip() -> None:
    assert parse_actor("rlcp-agent-", "rlcp-agent-12") == 12
    assert parse_actor("rlcp-agent-", "rlcp-agent-group-0-2") is None
    assert parse_actor("rlcp-agent-", "other-1") is None
    assert parse_group("rlcp-agent-", group_name("rlcp-agent-", Group(3, 4))) == Group(3, 4)


def test_agent_config_fixes_id_ports_and_readiness() -> None:
    s = RayPlacementSettings(address="127.0.0.1:6379", agent={"admin": {"token": "t", "port": 9}, "log_level": "x"})
    config = agent_config(s, 3)
    assert config["agent_id"] == "rlcp-agent-3" and config["admin"] == {"token": "t", "port": 0}
    assert config["inference"] == {"port": 0} and config["require_desired_version"] is True
    assert s.agent["admin"]["port"] == 9  # the template is not changed


def test_settings_refuse_placement_without_ray_discovery_and_empty_bundles() -> None:
    with pytest.raises(ValidationError, match="needs discovery.kind=ray"):
        ControllerSettings(placement={"kind": "ray", "ray": {"address": "127.0.0.1:6379"}})
    with pytest.raises(ValidationError, match="placement.ray"):
        ControllerSettings(placement={"kind": "ray"})
    with pytest.raises(ValidationError, match="empty bundles"):
        RayPlacementSettings(address="a:1", bundle={"CPU": 0})
    with pytest.raises(ValidationError):
        RayPlacementSettings(address="a:1", strategy="ANYWHERE")
    with pytest.raises(ValidationError, match=r"replicas \(9\) is above max_replicas \(8\)"):
        RayPlacementSettings(address="a:1", replicas=9, max_replicas=8)


def test_settings_refuse_a_teardown_deadline_the_front_would_cut_short() -> None:
    def settings(teardown_timeout_s: float, *, front: bool = True, teardown: bool = True) -> ControllerSettings:
        return ControllerSettings(
            api={"front": front, "core_stop_timeout_s": 30},
            discovery={"kind": "ray", "ray": {"dashboard_url": "http://127.0.0.1:8265"}},
            placement={
                "kind": "ray",
                "ray": {"address": "127.0.0.1:6379", "teardown": teardown, "teardown_timeout_s": teardown_timeout_s},
            },
        )

    assert settings(20).placement.ray is not None  # the defaults (20 s under 30 s) hold
    with pytest.raises(ValidationError, match=r"teardown_timeout_s \(30\) must be below api.core_stop_timeout_s"):
        settings(30)
    settings(30, front=False)  # no front to kill the core
    settings(30, teardown=False)

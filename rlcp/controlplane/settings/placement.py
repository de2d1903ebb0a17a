"""The `placement` section: the controller as a Ray driver keeping agents as actors (docs/ray.md).

`check_ray_placement` is the one rule placement shares with other sections (discovery, the
front's stop deadline); the root model calls it, since no section alone sees both sides.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlcp.core.settings import Section

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]  # Ray's placement group strategies


class BundleSettings(Section):
    """One agent's share of the cluster: a placement-group bundle, which the agent's actor takes whole."""

    CPU: float = Field(1.0, ge=0, description="Logical CPUs of one bundle (fractions allowed).")
    GPU: float = Field(
        0.0,
        ge=0,
        description="GPUs of one bundle: the engine's tensor-parallel size. Ray sets "
        "CUDA_VISIBLE_DEVICES for the actor, and the agent it starts inherits it.",
    )

    @model_validator(mode="after")
    def _check(self) -> BundleSettings:
        if self.CPU == 0 and self.GPU == 0:
            raise ValueError("placement.bundle needs some CPU or GPU (Ray refuses empty bundles)")
        return self


class RayPlacementSettings(Section):
    """The controller as a Ray driver keeping `replicas` agents as detached actors (docs/ray.md)."""

    address: str = Field(
        min_length=1,
        description="The Ray cluster's GCS address, `host:port` (e.g. "
        "127.0.0.1:6379, or a KubeRay head service `<head-svc>:6379`).",
    )
    namespace: str = Field("rlcp", min_length=1, description="Ray namespace of the actors and placement groups.")
    name_prefix: str = Field(
        "rlcp-agent-",
        min_length=1,
        description="Actor i is named `<name_prefix><i>`; placement groups `<name_prefix>group-<first>-<count>`.",
    )
    replicas: int = Field(
        1,
        ge=0,
        description="Agents to keep running, one per bundle, until `PUT "
        "/v1/rl/placement` (rlctl scale) sets a count in the desired state.",
    )
    max_replicas: int = Field(
        256,
        ge=1,
        description="The most agents `PUT /v1/rl/placement` may ask for (a typo "
        "must not ask Ray for thousands of actors).",
    )
    bundle: BundleSettings = Field(default_factory=BundleSettings)
    strategy: PlacementStrategy = Field(
        "PACK",
        description="Ray placement strategy of a group's bundles (a "
        "scale-up places its new bundles as a group of their own).",
    )
    agent: dict[str, Any] = Field(
        default_factory=dict,
        description="Agent settings (`rlcp.agent`'s YAML) every "
        "placed agent starts with; the actor sets agent_id, the ports (0: free ones) "
        "and require_desired_version.",
    )
    agent_host: str | None = Field(
        None, description="Host in the URLs an actor publishes; default the Ray node's address."
    )
    interval_s: float = Field(5.0, gt=0, description="How often the placed actors are checked, in seconds.")
    agent_start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="How long a placed actor waits for its agent to serve (an engine start-up: the model's "
        "weights loaded), in seconds; past it the actor fails and Ray starts it again.",
    )
    call_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Deadline of one pass of Ray calls (connect, list, create, wait for a group), in seconds.",
    )
    teardown: bool = Field(
        False,
        description="On controller stop, kill the actors and remove the groups. Off: "
        "they are detached and outlive the controller, which finds them again on start.",
    )
    teardown_timeout_s: float = Field(
        20.0,
        gt=0,
        description="Deadline of the teardown on stop, in seconds, a "
        "pass still under way included (it is interrupted at its next wait); below "
        "api.core_stop_timeout_s, after which the front kills the core.",
    )

    @model_validator(mode="after")
    def _check(self) -> RayPlacementSettings:
        if self.replicas > self.max_replicas:
            raise ValueError(f"placement.ray.replicas ({self.replicas}) is above max_replicas ({self.max_replicas})")
        return self


class PlacementSettings(Section):
    kind: Literal["none", "ray"] = Field(
        "none",
        description="none: the controller places nothing; ray: it keeps "
        "agents as Ray actors (leader only; needs the `ray` extra).",
    )
    ray: RayPlacementSettings | None = None

    @model_validator(mode="after")
    def _check(self) -> PlacementSettings:
        if self.kind == "ray" and self.ray is None:
            raise ValueError("placement.ray (with address) is required for kind=ray")
        return self


def check_ray_placement(
    placement: PlacementSettings, *, discovery_kind: str, front_stop_timeout_s: float | None
) -> None:
    """What placement kind ray needs of the other sections: discovery of the same actors (placed
    actors become members only through it), and, with a front, a teardown that ends before the
    front stops waiting for the core (`front_stop_timeout_s`; None: no front)."""
    if placement.kind != "ray":
        return
    if discovery_kind != "ray":
        raise ValueError("placement.kind=ray needs discovery.kind=ray (the placed actors' dashboard)")
    ray = placement.ray
    if (
        ray is not None
        and ray.teardown
        and front_stop_timeout_s is not None
        and ray.teardown_timeout_s >= front_stop_timeout_s
    ):
        raise ValueError(
            f"placement.ray.teardown_timeout_s ({ray.teardown_timeout_s:g}) must be below "
            f"api.core_stop_timeout_s ({front_stop_timeout_s:g}): the front kills the core "
            "then, teardown or not"
        )

"""The `discovery` section: where the fleet's members come from (static, an HTTP listing,
Kubernetes EndpointSlices, Ray actors), one nested section per kind."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from rlcp.controlplane.k8s.pod import pod_namespace
from rlcp.controlplane.workerspec import Flavor, WorkerSpec
from rlcp.core.settings import Section

# What an http_listing URL answers: a `GET /v1/rl/workers` listing (Dynamo's frontend, another
# controller), or an sglang-router's `GET /workers` (slime's and Miles' router; each worker a
# member of flavor sglang).
ListingFormat = Literal["rl_workers", "sglang_router"]


class HttpListingSettings(Section):
    url: str = Field(
        description="URL of a GET /v1/rl/workers listing (Dynamo's shape), or with format sglang_router "
        "of an sglang-router's worker list (`http://ROUTER:PORT/workers`)."
    )
    format: ListingFormat = Field(
        "rl_workers",
        description="rl_workers: a /v1/rl/workers listing. sglang_router: an sglang-router's `GET /workers`, "
        "each worker a member of flavor sglang whose URL is its admin and inference URL, its id (docs/controller.md, "
        "'SGLang: pointing the controller at slime / Miles servers').",
    )
    interval_s: float = Field(5.0, gt=0, description="Poll interval, in seconds.")
    timeout_s: float = Field(5.0, gt=0, description="Deadline of one poll, in seconds.")
    default_flavor: Flavor = Field("dynamo", description="Flavor of entries that do not name one.")
    token: SecretStr | None = None
    inference_url: str | None = Field(
        None,
        min_length=1,
        description="Where the listed workers take inference when an entry names no `inference_url`: for Dynamo, "
        "the frontend's OpenAI base URL (`--http-port`; the listing itself is served on `DYN_RL_PORT`), "
        "to which the gateway sends each rollout pinned to one instance. None: such members take no "
        "rollouts.",
    )

    @model_validator(mode="after")
    def _check_format(self) -> HttpListingSettings:
        # A router's workers are SGLang servers that take inference on their own URL: a flavor or
        # inference URL given for them would be silently ignored, so it is refused instead.
        if self.format == "sglang_router":
            for name in ("default_flavor", "inference_url"):
                if name in self.model_fields_set:
                    raise ValueError(
                        f"{name} cannot be set with format sglang_router (members are flavor sglang, "
                        "each taking inference on its own URL)"
                    )
        return self


DeadActors = Literal["keep", "drop"]  # what discovery kind ray does with a DEAD actor


class RaySettings(Section):
    """Members from a Ray cluster's actors, read through the dashboard's state API (docs/ray.md).
    The controller never imports `ray`: it reads plain HTTP."""

    dashboard_url: str = Field(
        min_length=1,
        description="Base URL of the Ray dashboard, whose state API "
        "(`/api/v0/actors`) is read, e.g. http://127.0.0.1:8265.",
    )
    namespace: str | None = Field(
        None,
        min_length=1,
        description="Ray namespace of the actors. None: every "
        "namespace, and a named actor's member id is then `namespace/name`.",
    )
    name_prefix: str | None = Field(None, min_length=1, description="Only actors whose name starts with this.")
    class_name: str | None = Field(
        None,
        min_length=1,
        description="Only actors of this class (Ray's `class_name`, the class's own name without its module).",
    )
    interval_s: float = Field(5.0, gt=0, description="Poll interval, in seconds.")
    timeout_s: float = Field(5.0, gt=0, description="Deadline of one poll, in seconds.")
    max_backoff_s: float = Field(30.0, gt=0, description="Longest wait between failed polls, in seconds.")
    limit: int = Field(
        10000,
        ge=1,
        le=10000,
        description="Most actors one poll reads (the state API's `limit`, "
        "at most 10000). A cluster with more than this is a failed poll, never a partial list.",
    )
    token: SecretStr | None = Field(
        None, description="Bearer token sent to the dashboard (a proxy in front of it); none: no Authorization header."
    )
    default_flavor: Flavor = Field("agent", description="Flavor of actors whose description names none.")
    dead_actors: DeadActors = Field(
        "keep",
        description="keep: a DEAD actor stays a member (unreachable, shown as such) until Ray forgets it; "
        "drop: it leaves the fleet, logged.",
    )


class KubernetesDiscoverySettings(Section):
    """EndpointSlices (discovery.k8s.io/v1) selected by label, list-then-watch."""

    namespace: str = Field(
        default_factory=pod_namespace, description="Namespace of the EndpointSlices; default the pod's own."
    )
    label_selector: str = Field(
        min_length=1, description="Selects the workers' EndpointSlices, e.g. `kubernetes.io/service-name=rl-workers`."
    )
    admin_port_name: str = Field("admin", min_length=1, description="EndpointSlice port name of the admin API.")
    inference_port_name: str = Field(
        "inference", min_length=1, description="EndpointSlice port name serving inference (optional on a slice)."
    )
    world_size_key: str = Field(
        "rlcp.io/world-size", min_length=1, description="Pod label or annotation holding a worker's inference ranks."
    )
    read_pods: bool = Field(
        True,
        description="Read each worker pod (once per pod) for `world_size_key` and its "
        "labels (the member's labels); off: only the EndpointSlice's own "
        "labels/annotations count for the world size, and members have no "
        "labels.",
    )
    flavor: Flavor = Field("agent", description="AdminAPI flavor of every discovered worker.")
    scheme: Literal["http", "https"] = Field("http", description="Scheme of the workers' URLs.")
    watch_timeout_s: int = Field(300, ge=1, description="Server-side length of one watch request, in seconds.")
    backoff_max_s: float = Field(30.0, gt=0, description="Longest wait before re-listing after failures, in seconds.")


class DiscoverySettings(Section):
    kind: Literal["static", "http_listing", "kubernetes", "ray"] = "static"
    static: list[WorkerSpec] = Field(default_factory=list, description="The members, for kind=static.")
    http_listing: HttpListingSettings | None = None
    kubernetes: KubernetesDiscoverySettings | None = None
    ray: RaySettings | None = None

    @model_validator(mode="after")
    def _check(self) -> DiscoverySettings:
        if self.kind == "http_listing" and self.http_listing is None:
            raise ValueError("discovery.http_listing is required for kind=http_listing")
        if self.kind == "kubernetes" and self.kubernetes is None:
            raise ValueError("discovery.kubernetes (with label_selector) is required for kind=kubernetes")
        if self.kind == "ray" and self.ray is None:
            raise ValueError("discovery.ray (with dashboard_url) is required for kind=ray")
        return self

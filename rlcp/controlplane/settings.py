"""The controller's settings: one pydantic-settings model built from small nested ones.

Sources, highest first: init kwargs, environment (`RLCP_`, nested with `__`, e.g.
`RLCP_API__PORT=8080`), a YAML file (`--config`), then defaults.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from rlcp.controlplane.workerspec import Flavor, WorkerSpec
from rlcp.core.labels import Labels, Selector, SelectorError, parse_selector
from rlcp.core.settings import Section, load_settings_with_yaml, read_token
from rlcp.core.wire.agent import PauseMode


class ApiSettings(Section):
    host: str = Field("127.0.0.1", description="Bind address of the controller API.")
    port: int = Field(8080, ge=0, le=65535, description="Controller API port (0 = pick a free one).")
    token: SecretStr | None = Field(None, description="Bearer token for mutating routes.")
    token_file: Path | None = Field(None, description="File holding the token (a mounted Secret).")
    auth_reads: bool = Field(False, description="Also require the token on read routes.")
    allow_anonymous: bool = Field(
        False,
        description="Let a request that sends no `Authorization` header through where the token "
        "is required (a wrong token is still a 401): for clients that have no token option "
        "(TRL's vLLM clients). Anyone who reaches the port then drives the fleet: bind it to "
        "loopback, or limit who reaches it (a Kubernetes NetworkPolicy). Logged as a warning at start.",
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body, in bytes.")
    front: bool = Field(
        True,
        description="Serve this port from a front process of its own, which answers "
        "/v1/rl/state from a replica of the controller's document and proxies the rest to the "
        "controller behind it (rlcp/controlplane/front/): reads do not wait for the fleet's work.",
    )
    front_follow_interval_s: float = Field(
        0.05,
        gt=0,
        description="How often the front reads the controller's "
        "state (a 304 while unchanged; each write is followed by a read), in s.",
    )
    front_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="Deadline of one request the front proxies (an "
        "update with wait: true lasts as long as the update), in seconds.",
    )
    front_stale_s: float = Field(
        30.0,
        gt=0,
        description="The front's /healthz fails once the controller behind "
        "it has not answered a state read for this long, in seconds.",
    )
    core_start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long the front waits for the controller behind it to serve before giving up, in seconds.",
    )
    core_stop_timeout_s: float = Field(
        30.0,
        gt=0,
        description="How long the front waits for the controller behind "
        "it to stop (once asked: its stdin closed) before killing it, in seconds.",
    )

    def resolved_token(self) -> str:
        token = read_token(self.token, self.token_file)
        if not token:
            raise ValueError("no API token: set RLCP_API__TOKEN or RLCP_API__TOKEN_FILE")
        return token


class EnvoySettings(Section):
    """Envoy as the gateway's data plane (`gateway.data_plane: envoy`, docs/gateway.md): the
    controller serves it the fence over xDS (ADS, gRPC) and waits for its ACK before pausing."""

    xds_host: str = Field("127.0.0.1", description="Bind address of the controller's xDS (ADS) gRPC server.")
    xds_port: int = Field(18000, ge=0, le=65535, description="xDS port (0 = pick a free one).")
    ack_timeout_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description="How long an update waits, after narrowing the "
        "fence and before pausing anyone, for every connected Envoy to ACK it, in "
        "seconds. Past it the update goes on and its record names each Envoy that had "
        "not (agents still refuse a request meant for other weights, and Envoy retries "
        "it on another member).",
    )
    listen_port: int = Field(
        10000,
        ge=0,
        le=65535,
        description="Envoy's listener port, in the bootstrap the "
        "controller writes (`rlcp.controlplane.gateway.envoy`).",
    )
    admin_port: int = Field(9901, ge=0, le=65535, description="Envoy's admin port (loopback only), in the bootstrap.")
    retry_back_off_s: float = Field(
        0.002,
        gt=0,
        le=1,
        description="Base back-off between Envoy's retries, in s "
        "(Envoy's own default, 25 ms, adds that much to the tail).",
    )
    max_retries: int = Field(
        1024,
        ge=1,
        description="Retries Envoy may have outstanding to one cluster at once "
        "(its default, 3, overflows under load and passes 409s on).",
    )


class GatewaySettings(Section):
    """The inference gateway: one endpoint for the fleet's rollouts, fenced by weight version."""

    enabled: bool = Field(True, description="Serve the gateway from the controller process.")
    host: str = Field("127.0.0.1", description="Bind address of the gateway.")
    port: int = Field(8090, ge=0, le=65535, description="Gateway port (0 = pick a free one).")
    token: SecretStr | None = Field(None, description="Bearer token for inference; none: inference is open.")
    token_file: Path | None = Field(None, description="File holding the inference token (a mounted Secret).")
    max_body_bytes: int = Field(8 << 20, ge=1024, description="Largest inference request body, in bytes.")
    hold_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="How long a request may wait for a member to serve (a pause, an update), in seconds.",
    )
    max_held: int = Field(4096, ge=0, description="Requests waiting at once; more are answered 503 at once.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Deadline to reach a worker, in seconds.")
    request_timeout_s: float = Field(600.0, gt=0, description="Deadline of one proxied request, in seconds.")
    # Under the workers' own keep-alive: vLLM's and SGLang's uvicorn close an idle connection after
    # 5 s (uvicorn's `timeout_keep_alive`, VLLM_HTTP_TIMEOUT_KEEP_ALIVE, SGLANG_TIMEOUT_KEEP_ALIVE).
    # A connection kept longer may be reused just as the worker closes it, and that try fails
    # ("Can not write request body", a reset), counting against the request's tries.
    upstream_idle_timeout_s: float = Field(
        4.0,
        gt=0,
        le=3600,
        description="How long an idle connection to a worker is kept for reuse, in seconds (the Python "
        "gateway and Envoy); keep it under the workers' own keep-alive (5 s for vLLM and SGLang).",
    )
    attempts: int = Field(
        3,
        ge=1,
        le=10,
        description="Tries of a request that fails before the first byte of an "
        "answer: other members first, then again. A connection refused (nothing listening) is not "
        "a try: that worker is ejected and the request sent elsewhere or held.",
    )
    max_in_flight_per_worker: int | None = Field(
        None,
        ge=1,
        description="Admission limit: requests out to one worker at once from this gateway; a request "
        "finding every member inside the fence at it is held (as during a pause) until one "
        "frees up or its hold deadline passes, then 503. None: no limit.",
    )
    outlier_failures: int = Field(
        5,
        ge=0,
        description="Failures in a row (before the first byte, a 5xx answer, a "
        "stream broken mid-way) that eject a worker from the rotation; 0: never eject.",
    )
    outlier_backoff_s: float = Field(
        1.0,
        gt=0,
        description="How long a worker's first ejection lasts, in seconds; "
        "each ejection in a row doubles it. After it, one request probes the worker.",
    )
    outlier_max_backoff_s: float = Field(30.0, gt=0, description="Longest ejection, in seconds.")
    affinity_header: str = Field(
        "X-RL-Session",
        min_length=1,
        description="Header naming a session; its requests go to one worker while it "
        "serves (`X-Session-ID`, verifiers' header, and the body's `user` "
        "also count; `cache_salt` does not: it isolates caches).",
    )
    affinity_load_factor: float | None = Field(
        1.25,
        ge=1.0,
        description="Session affinity that also balances (bounded-load consistent hashing): a session "
        "stays on its worker unless that worker has more than this factor times the mean "
        "of requests out (then its next worker in the session's own order takes it). "
        "None: plain affinity, however skewed the sessions.",
    )
    accept_admin_token: bool = Field(
        True,
        description="With `token` set, also accept the controller's admin token "
        "for inference, so one API key serves both URLs (prime-rl "
        "sends one key to both).",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="Standalone gateway only: its event loop. uvloop (the `gateway` extra) takes 5-15% less "
        "CPU per proxied request than asyncio's own (docs/performance.md section 7); auto: uvloop "
        "when installed.",
    )
    follow_url: str | None = Field(
        None, description="Standalone gateway only: the controller whose `GET /v1/rl/state` it follows."
    )
    follow_token: SecretStr | None = Field(None, description="Token for that controller's reads (auth_reads).")
    follow_interval_s: float = Field(0.2, gt=0, description="How often a standalone gateway reads the state.")
    controller_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="Standalone gateway only: deadline of one admin request it forwards to the "
        "controller (`follow_url`; an update with wait: true lasts as long as the update), in seconds.",
    )
    controller_connect_timeout_s: float = Field(
        3.0,
        gt=0,
        description="Standalone gateway only: deadline to connect to the controller for a "
        "forwarded admin request (past it: 503 naming the controller), in seconds.",
    )
    data_plane: Literal["python", "envoy"] = Field(
        "python",
        description="What carries rollouts: `python`, this process's gateway (the default), or `envoy`, "
        "an Envoy fed the fence by the controller over xDS (`envoy` settings; the Python "
        "gateway then does not run).",
    )
    envoy: EnvoySettings = EnvoySettings()

    def resolved_token(self) -> str | None:
        return read_token(self.token, self.token_file)


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


# Where a pod finds its own namespace (the service account volume every pod mounts).
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def pod_namespace() -> str:
    """The namespace this pod runs in, or "default" outside a cluster."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def pod_identity() -> str:
    """This replica's name in a Lease: the pod name (downward API `POD_NAME`), else the hostname
    (which Kubernetes sets to the pod name too)."""
    return os.environ.get("POD_NAME") or socket.gethostname()


class KubernetesApiSettings(Section):
    """How to reach the Kubernetes API; shared by discovery, leader election and the ConfigMap store."""

    api_url: str | None = Field(
        None,
        description="API server URL (tests, `kubectl proxy`). Unset: in-cluster "
        "config inside a pod, else the kubeconfig.",
    )
    kubeconfig: Path | None = Field(None, description="Kubeconfig file outside a cluster; default ~/.kube/config.")
    context: str | None = Field(None, description="Kubeconfig context; default the current one.")
    request_timeout_s: float = Field(10.0, gt=0, description="Deadline of one API call, in seconds.")


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


EngineMethod = Literal["GET", "POST"]
ENGINE_ROUTE_PATTERN = r"^[A-Za-z0-9_]{1,64}$"  # one path segment: no '/', no '..'
# Engine routes that give a worker a served model name (an adapter): never passed through, since
# the name would skip the check that no other fleet serves it (`POST /v1/rl/loras` makes it).
NAMING_ENGINE_ROUTES = frozenset({"load_lora_adapter", "load_lora"})
# The passthrough's defaults (`POST /v1/rl/engine/{route}`, docs/controller.md): routes each engine
# serves whose effects the controller either does not track or re-reads after the call. Left out on
# purpose: sleep / wake_up / release_kv_cache_memory (a slept engine is one the controller would
# still count as serving: a fleet operation of its own), collective_rpc (arbitrary code), and every
# route an operation already drives (pause, weights, LoRA), which must go through the operation.
DEFAULT_ENGINE_ROUTES: dict[Flavor, dict[str, EngineMethod]] = {
    "agent": {"is_paused": "GET", "weight_info": "GET", "get_world_size": "GET", "abort_requests": "POST"},
    "vllm": {
        "is_paused": "GET",
        "get_world_size": "GET",
        "server_info": "GET",
        "is_sleeping": "GET",
        "reset_prefix_cache": "POST",
        "reset_mm_cache": "POST",
        "reset_encoder_cache": "POST",
    },
    "dynamo": {},
}


class EngineRouteSettings(Section):
    """The guarded engine passthrough: which engine routes an operator may run through the controller."""

    allow: dict[Flavor, dict[str, EngineMethod]] = Field(
        default_factory=lambda: {f: dict(r) for f, r in DEFAULT_ENGINE_ROUTES.items()},
        description="Per flavor, route name -> HTTP method. A flavor left out keeps its defaults; an empty "
        "object allows nothing for it. Route names are one path segment (letters, digits, '_').",
    )

    @model_validator(mode="after")
    def _check(self) -> EngineRouteSettings:
        for flavor, routes in self.allow.items():
            for route in routes:
                if not re.match(ENGINE_ROUTE_PATTERN, route):
                    raise ValueError(
                        f"engine_routes.allow.{flavor}: route {route!r} is not one path segment of "
                        "letters, digits and '_'"
                    )
                if route in NAMING_ENGINE_ROUTES:
                    raise ValueError(
                        f"engine_routes.allow.{flavor}: route {route!r} loads an adapter, whose name "
                        "the gateway routes by: load it with POST /v1/rl/loras, which refuses a name "
                        "another fleet serves"
                    )
        self.allow = {**{f: dict(r) for f, r in DEFAULT_ENGINE_ROUTES.items()}, **self.allow}
        return self


class WorkerCallSettings(Section):
    """How the controller calls workers' admin APIs."""

    token: SecretStr | None = Field(None, description="Bearer token of the workers' admin APIs.")
    token_file: Path | None = None
    max_concurrency: int = Field(64, ge=1, description="Calls in flight at once across the fleet.")
    timeout_s: float = Field(10.0, gt=0, description="Deadline of one short admin call, in seconds.")
    attempts: int = Field(3, ge=1, description="Tries of an idempotent call.")
    retry_budget_s: float = Field(30.0, gt=0, description="All tries of one call together, in seconds.")
    pause_timeout_s: float = Field(60.0, gt=0, description="Default deadline to quiesce, in seconds.")
    weight_load_timeout_s: float = Field(600.0, gt=0, description="Deadline of a disk weight load, in seconds.")
    checkpoint_wait_s: float = Field(
        10.0,
        ge=0,
        description="How long a disk update waits, before pausing anyone, for its checkpoint to be "
        "there on the workers (shared storage that shows files a moment late), in seconds; checked every 0.25 s.",
    )
    deadline_grace_s: float = Field(
        5.0,
        gt=0,
        description="Our deadline on a call the engine bounds itself (a "
        "pause, a load) is the engine's plus this, so the worker's own answer, naming "
        "what it waited for, comes first; in seconds.",
    )

    def resolved_token(self) -> str | None:
        return read_token(self.token, self.token_file)


class ReconcileSettings(Section):
    poll_interval_s: float = Field(1.0, gt=0, description="How often every member's status is read, in seconds.")
    seen_refresh_s: float = Field(
        10.0,
        gt=0,
        description="How often the state document shows the last_seen of "
        "workers whose reads found nothing new, in seconds: such a read changes nothing "
        "else, so readers polling with If-None-Match get 304s between changes.",
    )
    interval_s: float = Field(1.0, gt=0, description="How often the reconciler looks for work, in seconds.")
    backoff_initial_s: float = Field(1.0, gt=0, description="First retry delay of a failing worker, in seconds.")
    backoff_max_s: float = Field(30.0, gt=0, description="Longest retry delay, in seconds.")
    yield_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long an API operation waits for the reconciler "
        "to yield (it stops between actions) before answering 409, in seconds.",
    )


class WeightTransferSettings(Section):
    """Broadcast weight updates (vLLM's weight-transfer protocol across the fleet)."""

    init_timeout_s: float = Field(330.0, gt=0, description="Deadline for every worker to join the trainer's group.")
    chunk_timeout_s: float = Field(600.0, gt=0, description="Deadline of start, each update chunk and finish.")
    idle_timeout_s: float = Field(600.0, gt=0, description="An open update with no call for this long is aborted.")
    pause_mode: PauseMode = Field("keep", description="How start pauses a fleet the trainer has not paused.")
    verify: bool = Field(True, description="After a named finish, check versions and weight checksums agree.")


class StoreSettings(Section):
    kind: Literal["file", "memory", "configmap"] = "file"
    path: Path = Field(Path(".rlcp-state/desired.json"), description="Desired-state file, for kind=file.")
    configmap_name: str = Field(
        "rl-controlplane-state", min_length=1, description="ConfigMap holding the desired state, for kind=configmap."
    )
    namespace: str = Field(
        default_factory=pod_namespace, description="Namespace of that ConfigMap; default the pod's own."
    )


FLEET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # a DNS label: it is a path segment and a suffix
DEFAULT_FLEET = "default"


def fleet_path(name: str) -> str:
    """Where a fleet's API is served: the root for the default fleet, `/fleets/<name>` for a named one."""
    return "" if name == DEFAULT_FLEET else f"/fleets/{name}"


def fleet_of(labels: Labels, selectors: Mapping[str, Selector]) -> str:
    """The fleet of a member with these labels: the first named one (in `selectors`' order, the
    settings' order) whose selector matches them, else the default fleet."""
    return next((name for name, sel in selectors.items() if sel.matches(labels)), DEFAULT_FLEET)


class FleetSettings(Section):
    """A named fleet: the members its selector matches, with a desired state of its own."""

    selector: str = Field(
        min_length=1,
        description="Label selector (Kubernetes syntax) of its members. A member "
        "goes to the first fleet, in the order written, whose selector matches it; members no "
        "fleet matches form the default fleet.",
    )
    models: list[str] = Field(
        default_factory=list,
        description="Model names the gateway routes to this fleet, "
        "besides the ones its members and adapters serve (read from them).",
    )

    @model_validator(mode="after")
    def _check(self) -> FleetSettings:
        try:
            parse_selector(self.selector)
        except SelectorError as exc:
            raise ValueError(f"selector: {exc}") from exc
        return self


class LeaderElectionSettings(Section):
    """One replica leads through a coordination.k8s.io/v1 Lease (client-go's algorithm)."""

    enabled: bool = Field(False, description="Off: this replica always leads (a single controller).")
    lease_name: str = Field("rl-controlplane", min_length=1, description="Name of the Lease.")
    namespace: str = Field(default_factory=pod_namespace, description="Namespace of the Lease; default the pod's own.")
    identity: str = Field(
        default_factory=pod_identity,
        min_length=1,
        description="This replica's holder identity; default env POD_NAME, else the hostname.",
    )
    lease_duration_s: float = Field(
        15.0, gt=0, description="How long others wait after the last renewal seen before taking the Lease, in seconds."
    )
    renew_deadline_s: float = Field(
        10.0,
        gt=0,
        description="The leader steps down when it has not renewed for this long, in seconds; below lease_duration_s.",
    )
    retry_period_s: float = Field(2.0, gt=0, description="Interval between tries to acquire or renew, in seconds.")

    @model_validator(mode="after")
    def _check(self) -> LeaderElectionSettings:
        # The old leader must stop before anyone else may start: renew_deadline < lease_duration.
        if self.renew_deadline_s >= self.lease_duration_s:
            raise ValueError("leader_election.renew_deadline_s must be below lease_duration_s")
        if self.retry_period_s >= self.renew_deadline_s:
            raise ValueError("leader_election.retry_period_s must be below renew_deadline_s")
        return self


class ControllerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLCP_", env_nested_delimiter="__", extra="forbid")

    controller_id: str = Field("rl-controlplane", description="Name in logs; the listing's namespace.")
    api: ApiSettings = ApiSettings()
    gateway: GatewaySettings = GatewaySettings()
    discovery: DiscoverySettings = DiscoverySettings()
    workers: WorkerCallSettings = WorkerCallSettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    weight_transfer: WeightTransferSettings = WeightTransferSettings()
    placement: PlacementSettings = PlacementSettings()
    engine_routes: EngineRouteSettings = EngineRouteSettings()
    # Factories, not shared instances: their defaults (pod namespace, POD_NAME) are read when
    # the settings are built, not when this module is imported.
    store: StoreSettings = Field(default_factory=StoreSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    kubernetes: KubernetesApiSettings = Field(default_factory=KubernetesApiSettings)
    fleets: dict[str, FleetSettings] = Field(
        default_factory=dict,
        description="Named fleets beside the default "
        "one, each served under `/fleets/<name>/` with the whole API "
        "(docs/controller.md, 'Fleets'); names are DNS labels, `default` is taken.",
    )
    allowed_roots: list[Path] = Field(
        default_factory=list, description="Weight and adapter paths must lie under one of these."
    )
    log_format: Literal["json", "console"] = "json"
    log_level: str = "info"

    @model_validator(mode="after")
    def _check(self) -> ControllerSettings:
        # Placed actors become members only through discovery of the same actors.
        if self.placement.kind == "ray" and self.discovery.kind != "ray":
            raise ValueError("placement.kind=ray needs discovery.kind=ray (the placed actors' dashboard)")
        ray = self.placement.ray
        if (
            self.placement.kind == "ray"
            and ray is not None
            and ray.teardown
            and self.api.front
            and ray.teardown_timeout_s >= self.api.core_stop_timeout_s
        ):
            raise ValueError(
                f"placement.ray.teardown_timeout_s ({ray.teardown_timeout_s:g}) must be below "
                f"api.core_stop_timeout_s ({self.api.core_stop_timeout_s:g}): the front kills the core "
                "then, teardown or not"
            )
        for name in self.fleets:
            if name == DEFAULT_FLEET or not re.match(FLEET_NAME_PATTERN, name):
                raise ValueError(
                    f"fleets: {name!r} is not a fleet name (a DNS label: lowercase letters, digits and "
                    f"'-', at most 63 characters; {DEFAULT_FLEET!r} is the default fleet's)"
                )
        if self.fleets:
            self._check_model_names()
        return self

    def _check_model_names(self) -> None:
        """A model name is served by exactly one fleet (docs/controller.md, "Fleets"): the names settings give the
        fleets -- a fleet's `models`, a static member's `model` in the fleet its labels select --
        clash at start, naming both fleets, not on the first rollout the wrong fleet serves."""
        selectors = {name: parse_selector(f.selector) for name, f in self.fleets.items()}
        given = [(model, name, f"fleets.{name}.models") for name, f in self.fleets.items() for model in f.models]
        if self.discovery.kind == "static":
            given += [
                (spec.model, fleet_of(spec.labels, selectors), f"discovery.static member {spec.id!r}'s model")
                for spec in self.discovery.static
                if spec.model
            ]
        first: dict[str, tuple[str, str]] = {}  # model -> (fleet, where the settings give it)
        for model, fleet, where in given:
            owner, owner_where = first.setdefault(model, (fleet, where))
            if owner != fleet:
                raise ValueError(
                    f"model name {model!r} is given to fleet {owner!r} ({owner_where}) and to fleet "
                    f"{fleet!r} ({where}): a model name is served by exactly one fleet"
                )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls)


def load_settings(config: Path | None = None, **overrides: Any) -> ControllerSettings:
    return load_settings_with_yaml(ControllerSettings, config, **overrides)

"""The `gateway` section: the inference gateway, and Envoy when it carries the rollouts.

The standalone gateway (`python -m rlcp.controlplane.gateway`) and the gateway's modules read this
section alone; the rest of the controller's settings are none of their business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from rlcp.core.settings import Section, read_token


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

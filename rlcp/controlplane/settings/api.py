"""The `api` section: the controller's own port, its token and the front process that serves it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

from rlcp.core.settings import Section, read_token


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

"""The agent's settings: one pydantic-settings model, built from small nested ones.

Sources, highest first: init kwargs (tests), environment (`RLAGENT_`, nested with
`__`, e.g. `RLAGENT_ADMIN__PORT=8101`), a YAML file (`--config`), then defaults.
Only `__main__` reads the environment; everything else gets a settings object.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from rlcp.agent.engine.base import EngineKind
from rlcp.core.settings import Section, YamlSettings, load_settings_with_yaml, read_token


class AdminSettings(Section):
    host: str = Field("127.0.0.1", description="Admin port bind address.")
    port: int = Field(8101, ge=0, le=65535, description="Admin port (0 = pick a free one).")
    token: SecretStr | None = Field(None, description="Bearer token for mutating admin routes.")
    token_file: Path | None = Field(None, description="File holding the token (a mounted Secret); read at start.")
    auth_reads: bool = Field(False, description="Also require the token on read routes.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest admin request body, in bytes.")

    def resolved_token(self) -> str:
        token = read_token(self.token, self.token_file)
        if not token:
            raise ValueError("no admin token: set RLAGENT_ADMIN__TOKEN or RLAGENT_ADMIN__TOKEN_FILE")
        return token


class InferenceSettings(Section):
    host: str = Field("127.0.0.1", description="Inference (OpenAI API) bind address.")
    port: int = Field(8100, ge=0, le=65535, description="Inference port (0 = pick a free one).")
    tokens_in_tokens_out: bool = Field(
        True,
        description="Serve vLLM's tokens-in/tokens-out route `POST /inference/v1/generate` (its scale-out "
        "routes, `vllm serve --enable-scale-out`), which verifiers' TrainClient and renderers' "
        "generate() post to.",
    )


class EngineSettings(Section):
    kind: EngineKind = Field("vllm", description="Real vLLM engine, or the simulated one.")
    model: str = Field("", description="Model directory (vllm) or model name (sim).")
    served_model_name: str | None = Field(None, description="Name clients use as `model`; defaults to `model`.")
    dtype: str = Field("auto", description="vLLM dtype (float32 on CPU).")
    max_model_len: int | None = Field(None, ge=16, description="Context length, in tokens.")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of device memory (host memory on CPU)."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs / compilation.")
    enable_lora: bool = Field(True, description="Start the engine with LoRA support.")
    max_lora_rank: int = Field(16, ge=1, description="Largest LoRA rank accepted.")
    max_loras: int = Field(4, ge=1, description="LoRAs resident at once.")
    tensor_parallel_size: int = Field(1, ge=1)
    extra_engine_args: dict[str, Any] = Field(default_factory=dict, description="Passed to vLLM's engine args as is.")
    engine_core_start: Literal["platform", "fork"] = Field(
        "platform",
        description="How vLLM starts its EngineCore process: as the platform says (vLLM's default, fork, on "
        "GPUs; spawn on CPUs, where the EngineCore imports vLLM and torch again, ~15 CPU-s), or `fork` on any "
        "platform (the EngineCore inherits what the agent imported instead of importing it again).",
    )
    # SimEngine knobs.
    sim_op_latency_s: float = Field(0.0, ge=0, description="Added latency of every admin primitive, in seconds.")
    sim_token_interval_s: float = Field(0.005, ge=0, description="Time per generated token, in seconds.")
    sim_load_latency_s: float = Field(
        0.0,
        ge=0,
        description="Added time of a disk weight load, in seconds (a real model's reload takes seconds to minutes).",
    )
    sim_world_size: int = Field(1, ge=1)


class TimeoutSettings(Section):
    """Deadlines of engine calls, in seconds. Nothing waits forever."""

    pause_s: float = Field(60.0, gt=0, description="pause (wait mode drains within this).")
    control_s: float = Field(30.0, gt=0, description="resume, versions, caches, LoRA, checksums.")
    weight_load_s: float = Field(600.0, gt=0, description="A full reload of weights from disk.")
    transfer_init_s: float = Field(300.0, gt=0, description="Joining a weight-transfer group.")
    transfer_chunk_s: float = Field(600.0, gt=0, description="One weight-transfer phase or chunk.")


class AgentSettings(YamlSettings):
    model_config = SettingsConfigDict(env_prefix="RLAGENT_", env_nested_delimiter="__", extra="forbid")

    agent_id: str = Field(
        default_factory=lambda: f"agent-{secrets.token_hex(3)}", description="Worker id in logs and state."
    )
    admin: AdminSettings = AdminSettings()
    inference: InferenceSettings = InferenceSettings()
    engine: EngineSettings = EngineSettings()
    timeouts: TimeoutSettings = TimeoutSettings()
    allowed_roots: list[Path] = Field(
        default_factory=list, description="Weight and adapter paths must resolve under one of these."
    )
    require_desired_version: bool = Field(
        False,
        description="Report not ready until a controller has told the desired version (set this in "
        "controller-managed fleets, so a restarted pod serves no rollouts before it is checked).",
    )
    exit_on_engine_death: bool = Field(
        True,
        description="End the process (exit status 3) once its engine has died, so whatever supervises it "
        "(the kubelet, Ray's actor restart, the local fleet) starts a fresh engine; the controller "
        "converges it before the gateway's fence takes it back. vLLM's own server ends the same "
        "way; false keeps a dead agent up, answering 503 `engine_dead`.",
    )
    log_format: Literal["json", "console"] = Field("json", description="structlog renderer.")
    log_level: str = Field("info")

    @model_validator(mode="after")
    def _check(self) -> AgentSettings:
        # A settings rule of one kind, kept with the settings so a bad file fails as bad settings
        # (exit 2) before anything starts; building engines by kind is `engine/factory.py`'s.
        if self.engine.kind == "vllm" and not self.engine.model:
            raise ValueError("engine.model is required for the vllm engine")
        return self


def load_settings(config: Path | None = None, **overrides: Any) -> AgentSettings:
    return load_settings_with_yaml(AgentSettings, config, **overrides)

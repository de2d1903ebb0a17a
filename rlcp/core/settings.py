"""What every process's settings build on: strict nested sections, token reading, and a
`--config` YAML file under the environment (pydantic-settings' own YAML source).

Each process has one settings model (`rlcp.agent.settings.AgentSettings`,
`rlcp.controlplane.settings.ControllerSettings`), a `YamlSettings` made of `Section`s; only its
`__main__` reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, YamlConfigSettingsSource


class Section(BaseModel):
    """A nested settings section: a misspelt key is an error, not a silently ignored option."""

    model_config = ConfigDict(extra="forbid")


def read_token(value: SecretStr | None, path: Path | None) -> str | None:
    """A token given inline wins over one in a file (a mounted Secret); None when neither."""
    if value is not None:
        return value.get_secret_value()
    if path is not None:
        return path.read_text().strip() or None
    return None


class YamlSettings(BaseSettings):
    """A process's settings model: keyword arguments over the environment over the `--config`
    YAML file (`load_settings_with_yaml` names it); no dotenv file, no secrets directory."""

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


S = TypeVar("S", bound=YamlSettings)


def load_settings_with_yaml(cls: type[S], config: Path | None, **overrides: Any) -> S:
    """Build `cls` from overrides, then the environment, then the YAML file `config`.

    The YAML path is a run-time choice (`--config`), while pydantic-settings reads it
    from the class config, so a subclass carries it; the result is still a `cls`.
    """
    if config is None:
        return cls(**overrides)
    if not config.is_file():
        raise FileNotFoundError(f"config file not found: {config}")
    configured: type[S] = type(cls.__name__, (cls,), {"model_config": {**cls.model_config, "yaml_file": config}})
    return configured(**overrides)

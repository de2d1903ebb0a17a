"""The controller's settings: one pydantic-settings model (`ControllerSettings`) built from one
section per concern, each in a module of its own (as vLLM keeps `vllm/config/`):

    api               the controller's port, its token, the front        api.py
    gateway           the inference gateway, Envoy as its data plane     gateway.py
    discovery         where members come from (static, HTTP, k8s, Ray)   discovery.py
    workers           calling the workers' admin APIs                    workers.py
    reconcile         reading members, the reconciler's pace             reconcile.py
    weight_transfer   broadcast updates                                  weight_transfer.py
    placement         agents kept as Ray actors                          placement.py
    engine_routes     the guarded engine passthrough's allowlist         engine_routes.py
    store             where desired state is kept                        store.py
    leader_election   the Lease                                          leader_election.py
    kubernetes        reaching the Kubernetes API                        kubernetes.py
    fleets            named fleets                                       fleets.py

A module that needs one section imports it from its module; this root holds the whole model,
the rules that span sections (each one written beside the section it guards), and the loader.

Sources, highest first: init kwargs, environment (`RLCP_`, nested with `__`, e.g.
`RLCP_API__PORT=8080`), a YAML file (`--config`), then defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from rlcp.controlplane.settings.api import ApiSettings
from rlcp.controlplane.settings.discovery import (
    DeadActors,
    DiscoverySettings,
    HttpListingSettings,
    KubernetesDiscoverySettings,
    ListingFormat,
    RaySettings,
)
from rlcp.controlplane.settings.engine_routes import EngineMethod, EngineRouteSettings
from rlcp.controlplane.settings.fleets import FleetSettings, check_fleet_names, check_model_names
from rlcp.controlplane.settings.gateway import EnvoySettings, GatewaySettings
from rlcp.controlplane.settings.kubernetes import KubernetesApiSettings
from rlcp.controlplane.settings.leader_election import LeaderElectionSettings
from rlcp.controlplane.settings.placement import (
    BundleSettings,
    PlacementSettings,
    RayPlacementSettings,
    check_ray_placement,
)
from rlcp.controlplane.settings.reconcile import ReconcileSettings
from rlcp.controlplane.settings.store import StoreSettings
from rlcp.controlplane.settings.weight_transfer import WeightTransferSettings
from rlcp.controlplane.settings.workers import WorkerCallSettings
from rlcp.core.settings import YamlSettings, load_settings_with_yaml

__all__ = [
    "ApiSettings",
    "BundleSettings",
    "ControllerSettings",
    "DeadActors",
    "DiscoverySettings",
    "EngineMethod",
    "EngineRouteSettings",
    "EnvoySettings",
    "FleetSettings",
    "GatewaySettings",
    "HttpListingSettings",
    "KubernetesApiSettings",
    "KubernetesDiscoverySettings",
    "LeaderElectionSettings",
    "ListingFormat",
    "PlacementSettings",
    "RayPlacementSettings",
    "RaySettings",
    "ReconcileSettings",
    "StoreSettings",
    "WeightTransferSettings",
    "WorkerCallSettings",
    "load_settings",
]


class ControllerSettings(YamlSettings):
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
        check_ray_placement(
            self.placement,
            discovery_kind=self.discovery.kind,
            front_stop_timeout_s=self.api.core_stop_timeout_s if self.api.front else None,
        )
        check_fleet_names(self.fleets)
        if self.fleets:
            check_model_names(self.fleets, self.discovery.static if self.discovery.kind == "static" else [])
        return self


def load_settings(config: Path | None = None, **overrides: Any) -> ControllerSettings:
    return load_settings_with_yaml(ControllerSettings, config, **overrides)

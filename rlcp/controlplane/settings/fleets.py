"""The `fleets` section: named fleets beside the default one (docs/controller.md, "Fleets").

What a fleet may be called and which fleet a member is in are `rlcp/controlplane/fleetnames.py`'s;
the checks here hold the settings to them at start (the root model calls them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pydantic import Field, model_validator

from rlcp.controlplane.fleetnames import DEFAULT_FLEET, FLEET_NAME_PATTERN, fleet_of
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.labels import SelectorError, parse_selector
from rlcp.core.settings import Section


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


def check_fleet_names(names: Iterable[str]) -> None:
    """Each named fleet's name is a DNS label (a path segment and a suffix) and not the default fleet's."""
    for name in names:
        if name == DEFAULT_FLEET or not re.match(FLEET_NAME_PATTERN, name):
            raise ValueError(
                f"fleets: {name!r} is not a fleet name (a DNS label: lowercase letters, digits and "
                f"'-', at most 63 characters; {DEFAULT_FLEET!r} is the default fleet's)"
            )


def check_model_names(fleets: Mapping[str, FleetSettings], static: Iterable[WorkerSpec]) -> None:
    """A model name is served by exactly one fleet (docs/controller.md, "Fleets"): the names settings give the
    fleets -- a fleet's `models`, a static member's `model` in the fleet its labels select --
    clash at start, naming both fleets, not on the first rollout the wrong fleet serves."""
    selectors = {name: parse_selector(f.selector) for name, f in fleets.items()}
    given = [(model, name, f"fleets.{name}.models") for name, f in fleets.items() for model in f.models]
    given += [
        (spec.model, fleet_of(spec.labels, selectors), f"discovery.static member {spec.id!r}'s model")
        for spec in static
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

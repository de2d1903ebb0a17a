"""Which fleet serves a request: the gateway routes by the body's `model` (docs/gateway.md, "Several fleets").

Each fleet has its own `Router` (its own fence). A request goes to the first named fleet that
serves its model (the `models` its state names: its settings' list, its members' base models,
the adapters it keeps or they report), else to the default fleet. With only the default
fleet there is nothing to choose and `model` is not read. A model no fleet serves, while the
default fleet has no members to try it, is a 404 naming `model` and what each fleet serves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from rlcp.controlplane.fleet.served import ServedModels
from rlcp.controlplane.gateway.routing import Router
from rlcp.core.errors import NotFoundError


@dataclass(frozen=True)
class FleetRoute:
    name: str
    router: Router
    models: ServedModels = field(default_factory=ServedModels)  # its members' cards, for GET /v1/models


class ModelRoutes:
    def __init__(self, default: FleetRoute, named: list[FleetRoute]) -> None:
        self.default, self.named = default, named

    def __iter__(self) -> Iterator[FleetRoute]:
        yield self.default
        yield from self.named

    def router_for(self, model: str | None) -> Router:
        if not self.named or model is None:
            return self.default.router
        for fleet in self.named:
            if model in fleet.router.served():
                return fleet.router
        state = self.default.router.state()
        if state is not None and not state.workers:
            serves = "; ".join(f"{f.name}: {', '.join(sorted(f.router.served())) or 'nothing yet'}" for f in self.named)
            raise NotFoundError(
                f"no fleet serves model {model!r} ({serves}; the default fleet has no members)", field="model"
            )
        return self.default.router

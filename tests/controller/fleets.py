"""What the controller tests' fleet fixtures (conftest.py) give, and the shape a module may ask
for by overriding `fleet_shape`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp

from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.harness.controller import Ctl
from rlcp.harness.processes import ControllerProcess
from rlcp.harness.simfleet import SimAgent


@dataclass(frozen=True)
class FleetShape:
    """The socket fleets' shape: how many agents, what their engines do, what the controller's
    settings change (a section per key: it replaces the in-process controller's section and is
    merged into the daemon's, as `start_controller` and `controller_config` take them)."""

    agents: int = 2
    engine: dict[str, Any] = field(default_factory=dict)  # SimEngine keywords, every agent
    settings: dict[str, Any] = field(default_factory=dict)
    inference: bool = False  # each agent's OpenAI port too (the gateway fleet's always have it)


class SimFleet(NamedTuple):
    ctl: Ctl
    agents: list[SimAgent]


class GatewayFleet(NamedTuple):
    agents: list[SimAgent]
    ctl: Ctl
    gateway: Gateway
    http: aiohttp.ClientSession


class DaemonFleet(NamedTuple):
    agents: list[SimAgent]
    ctl: ControllerProcess
    http: aiohttp.ClientSession


# Labels of a three-agent fleet with roles (test_labels_selectors, test_engine_passthrough).
ROLES = {
    "w0": {"role": "policy", "zone": "a"},
    "w1": {"role": "policy", "zone": "b"},
    "w2": {"role": "reference", "zone": "a"},
}


class Labelled:
    """An agent whose static spec carries labels."""

    def __init__(self, agent: SimAgent, labels: dict[str, str]) -> None:
        self.agent, self.labels = agent, labels

    def spec(self) -> dict[str, Any]:
        return self.agent.spec() | {"labels": self.labels}

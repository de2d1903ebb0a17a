"""What the controller tests' fleet fixtures (conftest.py) give, the shape a module may ask
for by overriding `fleet_shape`, and a gateway over a fleet state written by hand (for the
gateway's own tests, whose workers are loopback servers of their own; the state itself is made
by `rlcp.harness.fleet_state`, which the gateway benchmark uses too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from rlcp.controlplane.gateway.app import build_gateway_app
from rlcp.controlplane.gateway.metrics import GatewayMetrics
from rlcp.controlplane.gateway.proxy import Gateway
from rlcp.controlplane.gateway.routing import Router
from rlcp.controlplane.settings.gateway import GatewaySettings
from rlcp.core.wire.controller.state import FleetState
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


# -- a gateway over a state written by hand -------------------------------------------------
class FixedState:
    """The gateway's state source, holding what a test gives it; `set` is a new generation."""

    def __init__(self, state: FleetState) -> None:
        self.state, self.generation = state, 1

    def set(self, state: FleetState) -> None:
        self.state, self.generation = state, self.generation + 1

    def current(self) -> tuple[int, FleetState]:
        return self.generation, self.state


def gateway_client(
    state: FixedState, session: aiohttp.ClientSession, *, admin_token: str | None = None, **settings: object
) -> TestClient[web.Request, web.Application]:
    """aiohttp's test client over the gateway's app routing by `state` (`settings`: `GatewaySettings`)."""
    gateway = Gateway(
        router=Router(state),
        session=session,
        settings=GatewaySettings(**settings),
        metrics=GatewayMetrics(),
        admin_token=admin_token,
    )
    return TestClient(TestServer(build_gateway_app(gateway)))

"""The balancing policy a gateway runs, made from its settings: a new policy is one module
beside this one and one entry in `POLICIES`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

from rlcp.controlplane.gateway.balancing.least_load import LeastLoad
from rlcp.controlplane.gateway.balancing.policy import BalancingPolicy
from rlcp.controlplane.gateway.balancing.session_affinity import SessionAffinity
from rlcp.controlplane.settings.gateway import GatewaySettings

PolicyName = Literal["session_affinity", "least_load"]
# The gateway's own: a request with a session key keeps to its session's worker (bounded by
# `gateway.affinity_load_factor`); one without goes to the least loaded member.
DEFAULT_POLICY: PolicyName = "session_affinity"
POLICIES: Mapping[PolicyName, Callable[[GatewaySettings], BalancingPolicy]] = MappingProxyType(
    {
        "session_affinity": lambda s: SessionAffinity(load_factor=s.affinity_load_factor, without_key=LeastLoad()),
        "least_load": lambda _: LeastLoad(),
    }
)


def make_policy(settings: GatewaySettings, name: PolicyName = DEFAULT_POLICY) -> BalancingPolicy:
    try:
        make = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown balancing policy {name!r}; available: {sorted(POLICIES)}") from None
    return make(settings)

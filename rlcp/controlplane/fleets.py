"""Several fleets in one controller (docs/controller.md, "Fleets"): a `Controller` per fleet, one membership.

A named fleet is the members its selector matches (settings `fleets`, in the order written);
the members no named fleet matches form the default fleet, which is the whole fleet when none
is named -- so one-fleet settings behave exactly as before. Each fleet has everything a
controller has on its own: desired state (its own store), operation gate and log, reconciler,
weight-transfer session and gateway fence; they share the discovery source, the worker
session and leadership. The API serves the default fleet at the root and each named one
under `/fleets/<name>/` (`api/app.py`).

Discovery hands every list to `apply_membership`, which splits it (`partition`, pure) and
gives each controller its share. A member whose labels change so another selector takes it
leaves one fleet and joins the other: the first forgets it, the second converges it to its
own desired state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from rlcp.controlplane.controller import Controller
from rlcp.controlplane.discovery.base import DiscoverySource
from rlcp.controlplane.fleetnames import DEFAULT_FLEET, fleet_of
from rlcp.controlplane.workerspec import WorkerSpec
from rlcp.core.labels import Selector, parse_selector


def partition(specs: list[WorkerSpec], selectors: Mapping[str, Selector]) -> dict[str, list[WorkerSpec]]:
    """Each member in the first fleet (in `selectors`' order) whose selector matches its
    labels, else in the default fleet. Every fleet named has a list, empty or not."""
    shares: dict[str, list[WorkerSpec]] = {name: [] for name in (*selectors, DEFAULT_FLEET)}
    for spec in specs:
        shares[fleet_of(spec.labels, selectors)].append(spec)
    return shares


class Fleets:
    """The fleets' controllers by name, the default one first."""

    def __init__(self, default: Controller, named: Mapping[str, Controller] | None = None) -> None:
        self.default = default
        self.named = dict(named or {})
        self._selectors = {
            name: parse_selector(ctl.fleet_settings.selector)
            for name, ctl in self.named.items()
            if ctl.fleet_settings is not None
        }

    def __iter__(self) -> Iterator[Controller]:
        yield self.default
        yield from self.named.values()

    def apply_membership(self, specs: list[WorkerSpec]) -> None:
        if not self.named:
            self.default.apply_membership(specs)
            return
        shares = partition(specs, self._selectors)
        for ctl in self:
            ctl.apply_membership(shares[ctl.fleet])

    async def follow_discovery(self, source: DiscoverySource) -> None:
        async for specs in source.watch():
            self.apply_membership(specs)

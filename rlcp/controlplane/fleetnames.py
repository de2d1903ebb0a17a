"""Fleet names: what a fleet may be called, which fleet a member is in, where a fleet's API is served.

Pure rules over names and labels, read by the settings (which check fleet and model names at start),
the stores (a named fleet's desired state carries its name), the API and the gateway (a fleet's path),
and `fleets.py`, which splits the members among the fleets' controllers. It sits beside `fleets.py`
but in the lowest layer, so the settings and the stores read it without importing any controller.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlcp.core.labels import Labels, Selector

FLEET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"  # a DNS label: it is a path segment and a suffix
DEFAULT_FLEET = "default"


def fleet_path(name: str) -> str:
    """Where a fleet's API is served: the root for the default fleet, `/fleets/<name>` for a named one."""
    return "" if name == DEFAULT_FLEET else f"/fleets/{name}"


def fleet_of(labels: Labels, selectors: Mapping[str, Selector]) -> str:
    """The fleet of a member with these labels: the first named one (in `selectors`' order, the
    settings' order) whose selector matches them, else the default fleet."""
    return next((name for name, sel in selectors.items() if sel.matches(labels)), DEFAULT_FLEET)

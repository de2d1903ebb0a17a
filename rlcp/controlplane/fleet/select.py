"""Which members a request's `selector` names: the API's reads and selector-scoped operations
go through here, so a bad selector is the same 422 naming `selector` everywhere, raised before
any worker is touched."""

from __future__ import annotations

from rlcp.controlplane.errors import InvalidInput
from rlcp.controlplane.fleet.members import WorkerRecord
from rlcp.core.labels import Selector, SelectorError, parse_selector


def read_selector(text: str | None, *, field: str = "selector") -> Selector | None:
    """The parsed selector, or None for none given; a bad one is `InvalidInput` naming `field`."""
    if text is None:
        return None
    try:
        return parse_selector(text)
    except SelectorError as exc:
        raise InvalidInput(f"{field}: {exc}", field=field) from exc


def selected(records: list[WorkerRecord], selector: Selector | None) -> list[WorkerRecord]:
    """The records whose labels the selector matches (all of them without one)."""
    if selector is None:
        return list(records)
    return [r for r in records if selector.matches(r.spec.labels)]

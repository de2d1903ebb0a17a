"""Which fleet serves each model name, across one controller's fleets: a model name is served
by exactly one fleet (docs/controller.md, "Fleets"), since the gateway routes a request by its `model` to the
one fleet serving it (`gateway/fleets.py`).

A fleet comes to serve a name four ways (`Controller.served_names`): its settings' `models`,
its members' base models (as discovery names them or as they report), an adapter it loads,
and an adapter a member reports having. The ones asked for are checked: a settings clash is
an error at start (`settings/fleets.py`, naming both fleets), and an adapter load under a name another
fleet serves is a 409 naming both, before any worker is touched (`operations/lora.py`).

A load's claim is held from that check until its operation ends -- by then the name is in
its fleet's desired state, or the load failed and the name is free -- because each fleet has
its own operation gate: two loads of one name into two fleets run at once, and without the
claim both would pass the check. The check and the claim are one synchronous step on the
event loop, so the second load sees the first one's claim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from rlcp.controlplane.errors import ModelNameTaken


class ModelNames:
    """Every fleet's served names (read when asked: they follow membership and desired state),
    and the names adapter loads in progress have claimed."""

    def __init__(self) -> None:
        self._served: dict[str, Callable[[], Iterable[str]]] = {}
        self._claims: dict[str, str] = {}  # model name -> the fleet loading an adapter under it

    def add_fleet(self, fleet: str, served: Callable[[], Iterable[str]]) -> None:
        self._served[fleet] = served

    def owner(self, name: str, *, besides: str) -> str | None:
        """The fleet other than `besides` that serves `name` or is loading an adapter under it."""
        claimed = self._claims.get(name)
        if claimed is not None and claimed != besides:
            return claimed
        return next((fleet for fleet, served in self._served.items() if fleet != besides and name in served()), None)

    @contextmanager
    def claim(self, fleet: str, name: str, what: str) -> Iterator[None]:
        """Hold `name` for `fleet` while the body runs; `ModelNameTaken` (a 409 naming both
        fleets) when another fleet serves it or holds it."""
        other = self.owner(name, besides=fleet)
        if other is not None:
            raise ModelNameTaken(
                f"fleet {fleet!r} cannot serve {what} named {name!r}: fleet {other!r} serves that "
                "model name, and a model name is served by exactly one fleet (the gateway routes "
                "by it); choose another name, or unload it there first",
                model=name,
                serving=other,
                asking=fleet,
            )
        mine = name not in self._claims
        self._claims[name] = fleet
        try:
            yield
        finally:
            if mine:
                del self._claims[name]

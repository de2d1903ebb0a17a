"""Passive outlier detection: a worker that keeps failing requests leaves the rotation for a while.

A circuit per worker, driven by the requests themselves (no probes of its own, as Envoy's
outlier detection and the Rust routers' circuit breakers): `failures` failures in a row (before
the first byte, a 5xx answer, a stream broken mid-way) open the circuit and eject the worker for
`backoff_s`, doubled for each ejection in a row up to `max_backoff_s`. Once that time is up the
circuit is half-open: the next request the balancer would send there is the probe, one at a
time, and its outcome decides -- a success closes the circuit and forgets the ejections, a
failure ejects the worker again for longer. A request that ends without a verdict (its client
went away, or a fence change had it answered again) lets the next request probe instead.

This is not the fence: an ejected worker is still inside it, only not chosen. When every
member inside the fence is ejected, requests are held as during a pause (`proxy.py`) until
one's backoff is up and a probe goes out, within their hold deadline. A worker that cannot be
connected to at all (`unreachable`) or whose engine is dead (`eject`) is out at once, whatever
the count.

Pure code over a clock (a test seam); `proxy.py` reports each try's outcome as a `Verdict`
(`retry.py` says which for each way a try can end).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

CircuitState = Literal["closed", "open", "half_open"]
# What a try says of its worker: it served (`succeeded`), it failed (`failed`), nothing either way
# (`none`: its client went away, the fence was behind), it is down (`unreachable`: no connection),
# its engine is dead (`eject`).
Verdict = Literal["succeeded", "failed", "none", "unreachable", "eject"]


@dataclass
class _Circuit:
    consecutive: int = 0  # failures in a row
    streak: int = 0  # ejections in a row (since the last success): the backoff's exponent
    ejections: int = 0  # since the gateway started
    open_until: float | None = None  # None: closed
    probing: bool = False  # half-open, with its probe out


@dataclass(frozen=True)
class CircuitView:
    state: CircuitState
    consecutive_failures: int
    ejections: int
    back_in_s: float | None  # open: seconds until a probe may go


class Breakers:
    """The circuits of every worker that has failed a request (the rest are closed)."""

    def __init__(
        self,
        *,
        failures: int,
        backoff_s: float,
        max_backoff_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, CircuitState, float | None], None] | None = None,
    ) -> None:
        """`failures`: 0 never ejects. `on_change(worker, state, backoff_s)` sees each ejection
        ("open", its backoff) and each recovery ("closed", None)."""
        self.failures, self.backoff_s, self.max_backoff_s = failures, backoff_s, max_backoff_s
        self.clock, self._on_change = clock, on_change  # clock: a test seam
        self._circuits: dict[str, _Circuit] = {}
        self.ejected = 0  # circuits not closed: when 0, `available` is true for every worker

    def available(self, worker: str) -> bool:
        """May a request go there now: closed, or half-open with no probe out."""
        circuit = self._circuits.get(worker)
        if circuit is None or circuit.open_until is None:
            return True
        return not circuit.probing and self.clock() >= circuit.open_until

    def record(self, worker: str, verdict: Verdict, *, probe: bool) -> None:
        """A try's outcome (`probe`: it was the half-open circuit's probe, as `sent` said)."""
        if verdict == "succeeded":
            self.succeeded(worker, probe=probe)
        elif verdict == "failed":
            self.failed(worker, probe=probe)
        elif verdict == "unreachable":
            self.unreachable(worker, probe=probe)
        elif verdict == "eject":
            self.eject(worker)
        else:
            self.released(worker, probe=probe)

    def sent(self, worker: str) -> bool:
        """A request goes there; True when it is the half-open circuit's probe."""
        circuit = self._circuits.get(worker)
        if circuit is None or circuit.open_until is None or circuit.probing:
            return False
        circuit.probing = True
        return True

    def succeeded(self, worker: str, *, probe: bool) -> None:
        circuit = self._circuits.get(worker)
        if circuit is None:
            return
        circuit.consecutive = 0
        if circuit.open_until is not None and probe:
            circuit.open_until, circuit.probing, circuit.streak = None, False, 0
            self.ejected -= 1
            if self._on_change is not None:
                self._on_change(worker, "closed", None)

    def failed(self, worker: str, *, probe: bool) -> None:
        circuit = self._circuits.setdefault(worker, _Circuit())
        circuit.consecutive += 1
        if circuit.open_until is not None:
            if probe:  # the probe failed: out again, for longer
                circuit.probing = False
                self._eject(worker, circuit)
            return  # a request sent before the ejection, failing late: already out
        if self.failures and circuit.consecutive >= self.failures:
            self.ejected += 1
            self._eject(worker, circuit)

    def eject(self, worker: str) -> None:
        """Out at once, whatever the count (its engine died): it comes back as any ejected
        worker does, through a probe once the backoff is up."""
        circuit = self._circuits.setdefault(worker, _Circuit())
        if circuit.open_until is None:
            self.ejected += 1
        circuit.probing = False
        self._eject(worker, circuit)

    def unreachable(self, worker: str, *, probe: bool) -> None:
        """It could not be connected to (nothing listening): out at once, whatever the count, as
        for an engine's death, and a refused probe out again for longer. A refusal of a request
        sent before the ejection leaves it as it is: a burst of requests finding the worker down
        together is one ejection, or the burst alone would take its backoff to the longest and
        keep the worker out long after it came back."""
        circuit = self._circuits.setdefault(worker, _Circuit())
        circuit.consecutive += 1
        if circuit.open_until is None or probe:
            self.eject(worker)

    def released(self, worker: str, *, probe: bool) -> None:
        """The request ended without a verdict: the next one may probe."""
        circuit = self._circuits.get(worker)
        if probe and circuit is not None:
            circuit.probing = False

    def view(self, worker: str) -> CircuitView:
        circuit = self._circuits.get(worker)
        if circuit is None:
            return CircuitView("closed", 0, 0, None)
        if circuit.open_until is None:
            return CircuitView("closed", circuit.consecutive, circuit.ejections, None)
        left = circuit.open_until - self.clock()
        if left > 0:
            return CircuitView("open", circuit.consecutive, circuit.ejections, left)
        return CircuitView("half_open", circuit.consecutive, circuit.ejections, None)

    def _eject(self, worker: str, circuit: _Circuit) -> None:
        backoff = min(self.max_backoff_s, self.backoff_s * 2**circuit.streak)
        circuit.streak += 1
        circuit.ejections += 1
        circuit.open_until = self.clock() + backoff
        if self._on_change is not None:
            self._on_change(worker, "open", backoff)

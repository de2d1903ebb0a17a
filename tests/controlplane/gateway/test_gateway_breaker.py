"""The gateway's circuits per worker (`gateway/breaker.py`), pure: when a worker is ejected, how
long for, who probes it, and what a request without a verdict does."""

from __future__ import annotations

from rlcp.controlplane.gateway.breaker import Breakers


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def breakers(failures: int = 3) -> tuple[Breakers, Clock, list[tuple[str, str, float | None]]]:
    clock, changes = Clock(), []
    b = Breakers(
        failures=failures,
        backoff_s=1.0,
        max_backoff_s=3.0,
        clock=clock,
        on_change=lambda w, s, backoff: changes.append((w, s, backoff)),
    )
    return b, clock, changes


def test_failures_in_a_row_eject_and_a_success_between_them_forgives() -> None:
    b, clock, changes = breakers()
    for _ in range(2):
        b.failed("w", probe=False)
    b.succeeded("w", probe=False)
    for _ in range(2):
        b.failed("w", probe=False)
    assert b.available("w") and b.ejected == 0 and changes == []
    b.failed("w", probe=False)
    assert not b.available("w") and b.ejected == 1 and b.view("w").state == "open"
    assert changes == [("w", "open", 1.0)] and b.available("other")


def test_the_backoff_doubles_per_failed_probe_up_to_the_cap_and_one_probe_at_a_time() -> None:
    b, clock, changes = breakers(failures=1)
    b.failed("w", probe=False)
    for backoff in (2.0, 3.0, 3.0):
        clock.now += changes[-1][2] or 0
        assert b.view("w").state == "half_open" and b.available("w")
        assert b.sent("w") is True
        assert not b.available("w") and b.sent("w") is False  # the probe is out: nobody else goes
        b.failed("w", probe=True)
        assert changes[-1] == ("w", "open", backoff)
    clock.now += 3.0
    assert b.sent("w")
    b.released("w", probe=True)  # its client went away: no verdict, the next request probes
    assert b.available("w") and b.sent("w")
    b.succeeded("w", probe=True)
    assert changes[-1] == ("w", "closed", None) and b.ejected == 0 and b.view("w").ejections == 4
    b.failed("w", probe=False)
    assert changes[-1] == ("w", "open", 1.0)  # the streak starts over after a success


def test_a_late_failure_of_a_request_sent_before_the_ejection_changes_nothing() -> None:
    b, clock, changes = breakers(failures=1)
    b.failed("w", probe=False)
    b.failed("w", probe=False)
    assert len(changes) == 1 and b.ejected == 1


def test_zero_failures_never_ejects() -> None:
    b, _, changes = breakers(failures=0)
    for _ in range(100):
        b.failed("w", probe=False)
    assert b.available("w") and changes == [] and b.view("w").consecutive_failures == 100


def test_a_refused_connection_ejects_at_once_and_a_burst_of_them_is_one_ejection() -> None:
    b, clock, changes = breakers(failures=0)  # even with outlier detection off: it is down
    for _ in range(5):  # requests sent together, all finding the port closed
        b.unreachable("w", probe=False)
    assert changes == [("w", "open", 1.0)] and b.ejected == 1 and b.view("w").ejections == 1
    clock.now += 1.0
    assert b.sent("w") is True
    b.unreachable("w", probe=True)  # the probe refused too: out again, for longer
    assert changes[-1] == ("w", "open", 2.0) and b.ejected == 1 and not b.available("w")

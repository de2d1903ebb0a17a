"""How late the event loop runs what it was asked to run: the controller's own latency.

Every read of `/v1/rl/state`, every worker answer and every lease renewal waits for the one
event loop; a callback that holds it for 100 ms delays all of them by 100 ms. A probe that
asks to wake every `interval_s` and records how late it woke measures exactly that wait,
from inside, at the cost of one timer: the lateness goes to a histogram
(`rlcp_event_loop_lag_seconds`) and a wake later than `warn_s` is logged, so an operator
sees a stalled controller before its readers time out.
"""

from __future__ import annotations

import asyncio

import structlog
from prometheus_client import Histogram

log = structlog.get_logger("rlcp.controlplane.loopwatch")


async def watch_loop_lag(
    histogram: Histogram, *, interval_s: float = 0.05, warn_s: float = 0.25, iterations: int | None = None
) -> None:
    loop = asyncio.get_running_loop()
    n = 0
    while iterations is None or n < iterations:
        n += 1
        asked = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        lag = max(0.0, loop.time() - asked)
        histogram.observe(lag)
        if lag > warn_s:
            log.warning("event_loop_blocked", lag_s=round(lag, 3))

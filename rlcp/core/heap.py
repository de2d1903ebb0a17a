"""The garbage collector of a long-running asyncio server: startup's heap frozen.

A cyclic collection walks every tracked object of the generations it collects, holding the
event loop the whole time. A server's heap is mostly what startup made (modules, classes,
pydantic's schemas, the routes: 75,000 objects in the controller, 280,000 in a simulated
fleet host of 512 agents), none of it ever garbage, yet each full collection walked all of
it again: under update cycles over 1,024 workers the controller collected ~100 times a
second and 15 full collections in 20 s paused its loop for up to 130 ms, which readers of
`/v1/rl/state` waited for (bench/load_state.py; docs/performance.md). `settle` runs once
startup is done: one last collection, then `gc.freeze()` moves the survivors out of the
collector's sight (CPython's advice for servers), and a larger first-generation threshold
makes young collections rarer (most of a request's objects die by reference count long
before one runs).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000  # CPython's default is 700


def settle(young_threshold: int = YOUNG_THRESHOLD) -> int:
    """Collect, freeze what survived, raise the young threshold; returns the objects frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, older, oldest)
    return gc.get_freeze_count()


@contextmanager
def collector_paused() -> Iterator[None]:
    """`settle()`, then no collection at all until the block ends: for a load generator, whose
    own pauses (up to 90 ms) would be counted as the latency of the server it measures."""
    settle()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()

"""What Linux's /proc says of a running process, for what benchmarks and tests measure: the CPU
time its threads have run, and the processes a controller daemon is made of."""

from __future__ import annotations

from pathlib import Path


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds a process's live threads have run so far (Linux /proc); None once it is gone.

    Summed from each thread's `schedstat` (nanoseconds): `stat`'s user + system times count in
    clock ticks (10 ms), as coarse as a whole update cycle of a small fleet. A thread that has
    ended drops out of the sum, so take differences over spans its threads live through."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    total_ns = 0
    for task in tasks:
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended while being read
    return total_ns / 1e9


def controller_pids(pid: int) -> dict[str, int]:
    """The daemon's processes: the front and the core it started (`api.front`), or the one."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    if not children:
        return {"controller": pid}
    return {"controller-front": pid, **{f"controller-core{'' if i == 0 else i}": c for i, c in enumerate(children)}}

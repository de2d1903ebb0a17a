"""What Linux's /proc says of a running process, for what benchmarks and tests measure: the CPU
time its threads have run, the processes a controller daemon is made of, and a process's (or
each of its threads') state and parent, read from its `stat` line."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


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


def _stat_fields(stat: Path) -> list[str] | None:
    """The fields of a `stat` file after the command name, state first, then the parent's pid;
    None once the process (or thread) is gone. The name is cut at the last ')': it may hold
    spaces and parentheses of its own."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def state(pid: int, *, proc: Path = PROC) -> str | None:
    """The process's state letter (R running, S sleeping, T stopped, Z exited but not yet waited
    for, ...); None once it is gone."""
    fields = _stat_fields(proc / str(pid) / "stat")
    return fields[0] if fields else None


def parent(pid: int, *, proc: Path = PROC) -> int | None:
    """The pid of the process's parent; None once it is gone."""
    fields = _stat_fields(proc / str(pid) / "stat")
    return int(fields[1]) if fields else None


def thread_states(pid: int) -> list[str]:
    """The state letter of each of the process's live threads (a signal that stops a process
    reaches each thread on its own, so the process's own line says "T" before they all are)."""
    fields = (_stat_fields(stat) for stat in (PROC / str(pid) / "task").glob("*/stat"))
    return [f[0] for f in fields if f]


def gone(pid: int) -> bool:
    """Nothing runs under `pid` any more: no such process, or a zombie (exited; its parent has
    not waited for it yet)."""
    return state(pid) in (None, "Z")

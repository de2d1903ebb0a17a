"""What every benchmark shares: repeats and medians, the table, the JSON and the plot.

The machine these run on is shared and small, so absolute figures are noisy: each
benchmark measures its baseline in the same run and reports ratios against it, and
repeats every measurement (median of k).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlcp.harness.controller import merge_sections
from rlcp.harness.processes import REPO, ControllerProcess

OUT = REPO / "bench" / "out"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def controller_daemon(
    specs: list[dict[str, Any]],
    workdir: Path,
    *,
    name: str = "controller",
    env: dict[str, str] | None = None,
    stop_timeout_s: float = 20.0,
    **sections: Any,
) -> ControllerProcess:
    """The controller as deployed (`python -m rlcp.controlplane`: its API front and its core) over
    the workers `specs`, with a benchmark's settings: deadlines only a real hang trips, the
    status poll every second, no gateway, warnings only. A dict keyword is merged into its
    section (`rlcp.harness.controller.merge_sections`)."""
    config = merge_sections(
        {
            "controller_id": name,
            "api": {"host": "127.0.0.1", "port": 0},
            "gateway": {"enabled": False},
            "discovery": {"kind": "static", "static": specs},
            "workers": {"timeout_s": 10, "pause_timeout_s": 60, "weight_load_timeout_s": 120},
            "reconcile": {"poll_interval_s": 1.0, "interval_s": 1.0},
            "store": {"kind": "memory"},
            "allowed_roots": [str(workdir)],
            "log_format": "json",
            "log_level": "warning",
        },
        sections,
    )
    return ControllerProcess(config, workdir, name=name, env=env, stop_timeout_s=stop_timeout_s)


def quiet_logs() -> None:
    from rlcp.core.logs import configure_logging

    configure_logging("json", "error")


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (what docs/performance.md holds), printed as is."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"

    out = [line(list(headers)), "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) >= 0.001 else f"{value:.2e}"
    return str(value)


def write_json(name: str, payload: dict[str, Any], out_dir: Path = OUT) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    payload = {"benchmark": name, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine()} | payload
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def ensure_matplotlib() -> None:
    """The plots need matplotlib (the `bench` extra); install it when missing, as the docs say."""
    if importlib.util.find_spec("matplotlib") is None:
        print("bench: matplotlib is missing; installing it (pip install -e '.[bench]' does the same)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib>=3.8"], check=True)


def plot(
    name: str, draw: Callable[[Any], None], out_dir: Path = OUT, *, size: tuple[float, float] = (6.4, 3.6)
) -> Path:
    """Draw one figure with `draw(ax)`; saved small (docs/img/ keeps a copy)."""
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=size, dpi=80)
    draw(ax)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = out_dir / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def report(
    name: str,
    result: dict[str, Any],
    out_dir: Path | None,
    *,
    text: str,
    draw: Callable[[Path], Path],
    notes_before: Sequence[str] = (),
    notes_after: Sequence[str] = (),
) -> dict[str, Any]:
    """What every benchmark ends with: its table (and notes) printed, its JSON and its plot
    written to `out_dir` (default bench/out); returns `result`."""
    out_dir = out_dir or OUT
    for line in (*notes_before, text, *notes_after):
        print(line)
    print(f"json: {write_json(name, result, out_dir)}\nplot: {draw(out_dir)}")
    return result


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

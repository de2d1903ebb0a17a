"""Measurements that tests record as they run (recovery times, pause latencies), kept in
`bench/out/` (gitignored) next to the benchmarks' output; docs/reliability.md quotes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlcp.harness.processes import REPO

FIGURES_DIR = REPO / "bench" / "out"


def record_figures(name: str, key: str, figures: dict[str, Any]) -> Path:
    """Merge `figures` under `key` into bench/out/<name>.json and print them (pytest -s shows them)."""
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    path = FIGURES_DIR / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = figures
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
    print(f"\n[{name}] {key}: {json.dumps(figures, sort_keys=True)}")
    return path

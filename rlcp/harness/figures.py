"""Measurements that tests record as they run (recovery times, pause latencies), kept in
`bench/out/` (gitignored) next to the benchmarks' output; docs/reliability.md quotes them."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rlcp.harness.processes import REPO

FIGURES_DIR = REPO / "bench" / "out"


def record_figures(name: str, key: str, figures: dict[str, Any], *, directory: Path = FIGURES_DIR) -> Path:
    """Merge `figures` under `key` into `directory`/<name>.json and print them (pytest -s shows them).

    Tests in several processes (xdist workers) record into one file: the read, merge and write run
    under an exclusive lock on `<name>.lock`, and each writer writes a temporary file of its own
    before the rename. With one shared `<name>.tmp` and no lock, two workers wrote it at once, one
    renamed it, and the other's rename found nothing (a fresh-clone run's red); the last writer also
    dropped what the first had merged."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    with open(directory / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data[key] = figures
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, path)
    print(f"\n[{name}] {key}: {json.dumps(figures, sort_keys=True)}")
    return path

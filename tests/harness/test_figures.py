"""Figures recorded by tests in several processes at once into one file (xdist workers do): every
write lands, none fails, and the file is whole JSON after each."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from rlcp.harness.figures import record_figures

WRITERS, WRITES = 4, 25


def _writer(directory: str, writer: int) -> None:
    for i in range(WRITES):
        record_figures("shared", f"w{writer}-{i}", {"writer": writer, "i": i}, directory=Path(directory))


def test_writers_in_several_processes_lose_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_writer, args=(str(tmp_path), w)) for w in range(WRITERS)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    # A writer that raised (the rename of a temporary file another writer had already moved) exits 1.
    assert [w.exitcode for w in writers] == [0] * WRITERS
    data = json.loads((tmp_path / "shared.json").read_text())
    assert data == {f"w{w}-{i}": {"writer": w, "i": i} for w in range(WRITERS) for i in range(WRITES)}
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []

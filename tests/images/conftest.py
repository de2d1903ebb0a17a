"""The container image tests: `pytest -m images` selects them."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "images: builds a container image with buildah and runs it (needs root)")
    config.addinivalue_line("markers", "agent_image: builds and runs the CPU agent image (minutes, several GB; "
                                       "runs only with RLCP_TEST_AGENT_CPU_IMAGE=1)")

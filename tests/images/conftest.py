"""The container image tests: `pytest -m images` selects them."""

from __future__ import annotations

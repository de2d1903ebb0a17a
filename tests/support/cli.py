"""Command lines refused by argparse, as a user sees the refusal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def argparse_refusal(parse: Callable[[list[str]], Any], argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The last line argparse writes when `parse(argv)` refuses `argv`: usage errors exit with 2."""
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]

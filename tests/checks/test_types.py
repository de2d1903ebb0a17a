"""The type checker finds nothing: mypy, strict, over the packages `[tool.mypy]` in pyproject.toml
names (rlcp.core, rlcp.controlplane, rlcp.agent, rlcp.client, rlcp.harness, bench), and every
`# type: ignore` in them says which error it silences and why.

mypy keeps its incremental cache in the repository's `.mypy_cache/` (which mypy itself keeps out of
git), the one a run by hand uses too: a fresh checkout checks everything (~36 CPU-s on our machines),
a run after that only what changed (a second or two).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# An ignore names its error codes, then a comment of its own says why (a third-party stub that
# is wrong or missing): `# type: ignore[arg-type]  # the stub wants a V1Lease; ...`.
_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<codes>\[[\w\-, ]+\])?(?P<after>.*)")
_REASON = re.compile(r"\s*#\s*\S")


def _checked_packages() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(config["tool"]["mypy"]["packages"])


# A guard against a hang only, not a guess of the machine's speed: mypy always ends, and a fresh
# checkout's check, 38 s alone, took over 240 s beside a full run at load 14 (CI25). At the guard
# pytest-timeout interrupts the run, and subprocess.run kills mypy on the way out.
@pytest.mark.timeout(1800)
def test_mypy_strict_finds_nothing() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, f"mypy (strict; run it alone with `python -m mypy`):\n{done.stdout}{done.stderr}"


def _comments(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT]


def test_every_type_ignore_names_its_code_and_reason() -> None:
    bad = []
    for package in _checked_packages():
        for path in sorted((REPO / package.replace(".", "/")).rglob("*.py")):
            for line, comment in _comments(path):
                where = f"{path.relative_to(REPO)}:{line}: {comment}"
                if re.match(r"#\s*mypy:", comment):
                    bad.append(f"{where}  (no inline mypy configuration: the settings live in pyproject.toml)")
                found = _IGNORE.search(comment)
                if found is None:
                    continue
                if found["codes"] is None:
                    bad.append(f"{where}  (name the error code: `# type: ignore[code]`)")
                elif not _REASON.match(found["after"]):
                    bad.append(f"{where}  (say why after it: `# type: ignore[code]  # what the stub gets wrong`)")
    assert not bad, "type: ignore comments without a code or a reason:\n" + "\n".join(bad)

"""scripts/setup-dynamo.sh installs the versions it pins, whatever else its wheel cache holds.

The cache (/var/cache/rlcp-dynamo) outlives runs. When the script downloaded Dynamo's extras
unpinned, PyPI's msgspec 0.23.0 landed beside the cached 0.22.0, and installing the cache's
`*.whl` asked pip for both: every Dynamo test of a fresh-clone CI run failed at set-up with
`ResolutionImpossible`. Here a cache holding the pinned wheels and a second msgspec must still
install, offline, exactly the pinned msgspec.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from rlcp.harness.dynamo import dynamo_target
from rlcp.harness.processes import REPO

SCRIPT = REPO / "scripts" / "setup-dynamo.sh"


def _other_msgspec(folder: Path) -> Path:
    """A well-formed wheel of a msgspec version the script does not pin."""
    name = "msgspec-0.99.0"
    path = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("msgspec/__init__.py", "")
        wheel.writestr(f"{name}.dist-info/METADATA", "Metadata-Version: 2.1\nName: msgspec\nVersion: 0.99.0\n")
        wheel.writestr(
            f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{name}.dist-info/RECORD", "")
    return path


def test_a_cache_with_a_second_version_of_an_extra_still_installs_the_pinned_one(tmp_path: Path) -> None:
    dynamo_target()  # fills the machine's cache (a no-op where it is full)
    machine_cache = Path(os.environ.get("RLCP_DYNAMO_CACHE", "/var/cache/rlcp-dynamo"))
    cache = tmp_path / "cache"
    shutil.copytree(machine_cache, cache)
    _other_msgspec(cache / "extras")
    target = tmp_path / "dynamo"

    out = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "RLCP_DYNAMO_CACHE": str(cache), "RLCP_DYNAMO_TARGET": str(target), "PIP_NO_INDEX": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(target)
    installed = sorted(p.name for p in target.glob("msgspec-*.dist-info"))
    assert installed == ["msgspec-0.22.0.dist-info"]
    assert (target / "dynamo").is_dir() and (target / "redis").is_dir()

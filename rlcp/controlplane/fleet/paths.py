"""Weight and adapter paths, checked against the allowed roots before any worker is touched."""

from __future__ import annotations

import os.path
import posixpath
from pathlib import Path

from rlcp.controlplane.errors import MalformedInput, PathOutsideRoots


def check_path(raw: str, field: str, roots: list[Path]) -> str:
    """The normalized path, if it lies under one of `roots`: lexically, and with symlinks
    resolved as far as the controller sees the path (a shared mount), so a link out of a
    root is refused here, not by every worker. Workers resolve it again themselves: the
    controller may not mount the weights."""
    if "\x00" in raw:
        raise MalformedInput("path contains a NUL byte", field=field)
    if not raw.startswith("/"):
        raise PathOutsideRoots(f"path must be absolute: {raw!r}", field=field)
    normalized = posixpath.normpath(raw)
    resolved_roots = [posixpath.normpath(str(r.resolve())) for r in roots]

    def inside(path: str) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in resolved_roots)

    if not inside(normalized) or not inside(os.path.realpath(normalized)):
        raise PathOutsideRoots(f"path {raw!r} is outside the allowed roots", field=field)
    return normalized

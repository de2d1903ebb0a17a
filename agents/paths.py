"""Resolve a user-given weight or adapter path and check it against the allowed roots.

Resolution follows symlinks, so a link inside a root that points outside is refused;
a relative path is refused outright (it would depend on the agent's working dir).
"""

from __future__ import annotations

from pathlib import Path

from rlcore.errors import BadRequestError, ForbiddenPathError


def resolve_allowed_dir(raw: str, roots: list[Path], *, field: str) -> Path:
    """Return the resolved directory, or raise 403 (outside roots) / 400 (bad path)."""
    if "\x00" in raw:
        raise BadRequestError("path contains a NUL byte", field=field)
    given = Path(raw)
    if not given.is_absolute():
        raise ForbiddenPathError(f"path must be absolute: {raw!r}", field=field)
    resolved = given.resolve(strict=False)
    if not any(resolved.is_relative_to(root.resolve()) for root in roots):
        raise ForbiddenPathError(f"path {raw!r} is outside the allowed roots", field=field)
    if not resolved.is_dir():
        raise BadRequestError(f"path {raw!r} is not an existing directory", field=field)
    return resolved

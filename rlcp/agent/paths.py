"""Resolve a user-given weight or adapter path and check it against the allowed roots.

Resolution follows symlinks, so a link inside a root that points outside is refused;
a relative path is refused outright (it would depend on the agent's working dir). The
same holds for the files in the directory: the engine opens each one, and a file symlink
(`<root>/dir/model.safetensors -> /elsewhere/...`) would read bytes from outside every
root although the directory itself resolved inside one (`contained_files`).
"""

from __future__ import annotations

from pathlib import Path

from rlcp.core.errors import BadRequestError, ForbiddenPathError, UnavailablePathError


def resolve_allowed_dir(raw: str, roots: list[Path], *, field: str) -> Path:
    """Return the resolved directory, or raise 403 (outside roots) / 400 (bad path)."""
    if "\x00" in raw:
        raise BadRequestError("path contains a NUL byte", field=field)
    given = Path(raw)
    if not given.is_absolute():
        raise ForbiddenPathError(f"path must be absolute: {raw!r}", field=field)
    resolved = given.resolve(strict=False)
    if not _inside(resolved, roots):
        raise ForbiddenPathError(f"path {raw!r} is outside the allowed roots", field=field)
    if not resolved.is_dir():
        raise UnavailablePathError(f"path {raw!r} is not an existing directory", field=field)
    return resolved


def contained_files(directory: Path, roots: list[Path], *, field: str) -> list[Path]:
    """The directory's entries, each resolved: 403 naming the first that lies outside the
    allowed roots (a symlink out), so nothing the engine opens from here escapes them."""
    entries = sorted(directory.iterdir())
    for entry in entries:
        target = entry.resolve(strict=False)
        if not _inside(target, roots):
            raise ForbiddenPathError(
                f"{entry.name!r} in {str(directory)!r} resolves outside the allowed roots (to {str(target)!r})",
                field=field,
            )
    return entries


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path.is_relative_to(root.resolve()) for root in roots)


def allowed_dir(raw: str, roots: list[Path], *, field: str) -> Path:
    """`resolve_allowed_dir`, and every entry of the directory inside the roots too
    (`contained_files`): what a disk load or an adapter load may open."""
    path = resolve_allowed_dir(raw, roots, field=field)
    contained_files(path, roots, field=field)
    return path

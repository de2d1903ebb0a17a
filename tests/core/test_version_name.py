"""The one version-name type (`rlcp.core.wire.versions`) at its edges, and where a name no model
checked meets it: a desired state stored before the rule."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from rlcp.controlplane.persistence.file import FileStore
from rlcp.core.wire.versions import VERSION_MAX_LENGTH, VersionName, is_version_name

NAMES = TypeAdapter(VersionName)


@pytest.mark.parametrize(
    "name",
    [
        "v1",
        "step-000123",
        "sha256:0f1e",
        "2026-01-01T00:00:00Z",
        "a/b@c+d=e",
        "x" * VERSION_MAX_LENGTH,
        "".join(chr(c) for c in range(0x21, 0x7F)),
    ],
)
def test_a_name_of_visible_ascii_is_a_version(name: str) -> None:
    assert NAMES.validate_python(name) == name and is_version_name(name)


@pytest.mark.parametrize(
    "name,why",
    [
        ("", "at least 1"),
        ("v\u0001x", "control character"),
        ("v\x00", "control"),
        ("v\x7f", "control"),
        ("v5\n", "whitespace"),
        ("a b", "whitespace"),
        ("v\u00a0", "whitespace"),
        ("v\u00e9", "non-ASCII"),
        ("v\u2028", "whitespace"),
        ("x" * (VERSION_MAX_LENGTH + 1), "at most"),
    ],
)
def test_anything_else_is_refused_saying_why(name: str, why: str) -> None:
    assert not is_version_name(name)
    with pytest.raises(ValidationError) as exc:
        NAMES.validate_python(name)
    assert why in str(exc.value), str(exc.value)


async def test_a_desired_state_stored_with_a_bad_name_is_refused_at_load_naming_the_field(tmp_path) -> None:
    path = tmp_path / "desired.json"
    path.write_text(json.dumps({"weight_version": "v5\n", "applied_versions": ["v4", "v5\n"]}))
    with pytest.raises(ValidationError) as exc:
        await FileStore(path).load()
    assert "weight_version" in str(exc.value) and "applied_versions.1" in str(exc.value)

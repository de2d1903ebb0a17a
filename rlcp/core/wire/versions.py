"""The one type of a weight or LoRA version name, shared by every model that takes one.

A version name does not stay in a JSON body: the gateway puts the version it admitted a
worker at into `X-RL-Expect-Weight-Version` (to the worker) and `X-RL-Weight-Version` (to
the client), logs carry it, and an operator types it into `rlctl`. So a name must survive
all of these unchanged:

- visible ASCII only (0x21-0x7E): no whitespace, no control characters (NUL, \\x01, \\x1f,
  DEL, a trailing newline read from a file), nothing outside ASCII. HTTP/1.1 allows
  obs-text (bytes >= 0x80) in a field value, but servers decode it differently (aiohttp as
  UTF-8, uvicorn as Latin-1), so a non-ASCII name would reach a worker as another name;
- 1 to `VERSION_MAX_LENGTH` characters.

`\\s` in a pattern is not enough: it misses NUL, \\x01-\\x08, \\x0e-\\x1f and \\x7f, which is how
`"v\\u0001x"` once passed and then made the gateway answer 500 to every rollout.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

VERSION_MAX_LENGTH = 256
# The one home of a version name's shape: the models below validate with it and the OpenAPI
# documents publish it, so a fuzzer generating from the documents learns the same rule.
VERSION_PATTERN = r"^[\x21-\x7e]+$"
VERSION_RULE = (
    f"visible ASCII (0x21-0x7E: no whitespace, control or non-ASCII characters), "
    f"1 to {VERSION_MAX_LENGTH} characters, so it is safe in an HTTP header"
)
_VERSION = re.compile(r"[\x21-\x7e]{1,%d}" % VERSION_MAX_LENGTH)


def _check_version(value: str) -> str:
    # Checked here rather than by `pattern`, so the 422 says which character is wrong and why
    # (a pattern's message only repeats the pattern); the documents still publish the pattern.
    if not is_version_name(value):
        raise ValueError(f"{describe_bad_version(value)}; a version name is {VERSION_RULE}")
    return value


VersionName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=VERSION_MAX_LENGTH,
        json_schema_extra={"pattern": VERSION_PATTERN},
        description=f"A weight or LoRA version name: {VERSION_RULE}.",
    ),
    AfterValidator(_check_version),
]


def is_version_name(value: object) -> bool:
    """Whether `value` is a valid version name: for code that meets a version no model
    checked (one a worker reports, one stored before this rule), to refuse using it where
    it would break something (an HTTP header) rather than crash there."""
    return isinstance(value, str) and _VERSION.fullmatch(value) is not None


def describe_bad_version(value: str) -> str:
    """What is wrong with `value` as a version name, for an error message (the name itself
    is shown escaped: it may hold the very characters a log line or header cannot)."""
    if not value:
        return "empty"
    if len(value) > VERSION_MAX_LENGTH:
        return f"{len(value)} characters (at most {VERSION_MAX_LENGTH})"
    for i, ch in enumerate(value):
        if not "\x21" <= ch <= "\x7e":
            kind = (
                "whitespace"
                if ch.isspace()
                else "a control character"
                if ord(ch) < 0x20 or ord(ch) == 0x7F
                else "a lone surrogate"
                if 0xD800 <= ord(ch) <= 0xDFFF
                else "a non-ASCII character"
            )
            return f"{value[:64]!r} has {kind} ({ch!r}) at index {i}"
    return f"{value[:64]!r} is not a version name"

"""The kernel's body parser (`rlcp.core.body`) at its edges: what it must still accept."""

from __future__ import annotations

import pytest

from rlcp.core.body import MAX_DEPTH, parse_json
from rlcp.core.errors import BadRequestError


def test_depth_up_to_the_limit_is_accepted_and_one_more_is_a_400() -> None:
    assert parse_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    with pytest.raises(BadRequestError) as exc:
        parse_json(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert exc.value.field == "body" and "deeper" in exc.value.message


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    prompt = "[{" * 1000 + '\\"' + "}]" * 1000
    assert parse_json(('{"prompt": "' + prompt + '", "n": [[1]]}').encode())["n"] == [[1]]


def test_a_surrogate_pair_is_text_and_a_lone_surrogate_is_a_400() -> None:
    assert parse_json(b'{"p": "\\ud83d\\ude00"}') == {"p": "\U0001f600"}
    for body, field in (
        (b'{"p": "\\ud83d"}', "p"),
        (b'{"p": ["x", {"\\udc00": 1}]}', "p.1"),
        (b'{"a": {"b": ["\\udfff"]}}', "a.b.0"),
    ):
        with pytest.raises(BadRequestError) as exc:
            parse_json(body)
        assert exc.value.status == 422 and exc.value.field == field, body


def test_long_token_lists_take_the_fast_path() -> None:
    tokens = list(range(200_000))
    assert parse_json(f'{{"prompt": {tokens}}}'.encode())["prompt"] == tokens

"""`rlcp.core.cached`: a cached document answered as a 304, gzip or plain, from one generation's
bytes; the header parsing follows RFC 9110 (weak comparison for `If-None-Match`, q-values in
`Accept-Encoding`)."""

from __future__ import annotations

import gzip

import pytest
from aiohttp.test_utils import make_mocked_request

from rlcp.core.cached import CachedBody, EntityTags, accepts_gzip, cached_response, none_match


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False),
        ("", False),
        ("gzip, deflate", True),
        ("deflate, gzip;q=0.5", True),
        ("GZIP", True),
        ("x-gzip", True),
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("identity", False),
        ("br, zstd", False),
        ("*", True),
        ("*;q=0", False),
        ("*, gzip;q=0", False),
        ("gzip;q=bad", False),
    ],
)
def test_accepts_gzip(header, expected) -> None:
    assert accepts_gzip(header) is expected


def test_none_match_compares_weakly_and_takes_lists_and_star() -> None:
    tag = 'W/"abc.7"'
    assert none_match(tag, tag) and none_match('"abc.7"', tag) and none_match('"x.1", W/"abc.7"', tag)
    assert none_match("*", tag)
    assert not none_match(None, tag) and not none_match('W/"abc.8"', tag) and not none_match('W/"abd.7"', tag)


def test_tags_name_the_instance_and_the_generation() -> None:
    a, b = EntityTags(), EntityTags()
    assert a.tag(3) != a.tag(4) and a.tag(3) == a.tag(3)
    assert a.tag(3) != b.tag(3)  # another process (or cache) counting from zero again


def test_the_gzip_copy_is_made_once_and_decompresses_to_the_bytes() -> None:
    body = CachedBody(etag='W/"i.1"', data=b'{"workers":[' + b'{"id":"w"},' * 500 + b"{}]}")
    first = body.gzipped()
    assert body.gzipped() is first and gzip.decompress(first) == body.data and len(first) < len(body.data) // 10


def test_the_response_is_a_304_gzip_or_plain() -> None:
    built: list[CachedBody] = []
    cached = CachedBody(etag='W/"i.2"', data=b'{"phase":"serving"}')

    def body() -> CachedBody:
        built.append(cached)
        return cached

    def answer(**headers: str):
        return cached_response(make_mocked_request("GET", "/s", headers=headers), etag=cached.etag, body=body)

    plain = answer()
    assert plain.status == 200 and plain.body == cached.data and "Content-Encoding" not in plain.headers
    assert plain.headers["ETag"] == cached.etag and plain.headers["Vary"] == "Accept-Encoding"
    zipped = answer(**{"Accept-Encoding": "gzip, deflate"})
    assert zipped.headers["Content-Encoding"] == "gzip" and gzip.decompress(zipped.body) == cached.data
    assert zipped.headers["ETag"] == cached.etag and not zipped.compression  # aiohttp's own: off
    assert len(built) == 2
    not_modified = answer(**{"If-None-Match": cached.etag, "Accept-Encoding": "gzip"})
    assert not_modified.status == 304 and not_modified.body is None and not_modified.headers["ETag"] == cached.etag
    assert len(built) == 2  # a match builds nothing
    assert answer(**{"If-None-Match": 'W/"i.1"'}).status == 200

"""Reading a request body: the one parser of every process (the controller's front and
core, the agent's admin port, the gateway), so what each refuses, and how, cannot drift.

Whatever a client sends, the answer is a 4xx naming what is wrong, never a 500:

    415 Content-Encoding   a coding we do not decode (br, zstd, anything unknown), or any
                           coding where the caller forwards the body as it came (the gateway)
    400 Content-Encoding   a body that is not what its Content-Encoding says: a plain body
                           labelled gzip, a truncated or corrupt stream, bytes after its end
    413 body               larger than the process's limit, as sent or once decoded
    400 body               not UTF-8, not JSON, NaN or Infinity, an integer too long to
                           convert, or nested deeper than `MAX_DEPTH` (Python's own decoder
                           would raise RecursionError)
    422 <field>            a string holding a lone surrogate (`"\\ud800"`): valid JSON, not text

The kernel decodes Content-Encoding itself, not aiohttp: aiohttp's decoder lets a truncated
gzip stream through as a shorter body, answers an undecodable one from inside `read()`, and
refuses br/zstd without their modules before any middleware runs (a text/plain 400). A
process opts in with `BODY_HANDLER_ARGS` on its `web.Application` (every process does).
`decode=False` is for a caller that forwards the body as it came (the gateway: its workers
take identity bodies), and takes identity bodies only.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from aiohttp import web

from rlcp.core.errors import (
    BadRequestError,
    PayloadTooLargeError,
    UnsupportedEncodingError,
    ValidationFailedError,
)

# `web.Application(handler_args=BODY_HANDLER_ARGS)`: the body reaches `read_body` as sent.
BODY_HANDLER_ARGS: dict[str, Any] = {"auto_decompress": False}
# Our request bodies are a few levels deep; an OpenAI chat body with tool schemas, ten or
# twenty. Far below where a recursive walk (json, pydantic, a log renderer) would give out.
MAX_DEPTH = 64
CONTENT_ENCODING = "Content-Encoding"
_DECODED = frozenset({"gzip", "x-gzip", "deflate"})
_IDENTITY = frozenset({"", "identity"})
# A `\uD800`-`\uDFFF` escape: only bodies holding one can hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


async def read_body(request: web.Request, *, decode: bool = True) -> bytes:
    """The body as the handler must see it: decoded per its Content-Encoding (when `decode`),
    within the request's size limit. Raises a 4xx `ApiError` (see the module docstring)."""
    codings = _codings(request.headers.get(CONTENT_ENCODING, ""))
    unknown = [c for c in codings if c not in _DECODED]
    if unknown and decode:
        raise UnsupportedEncodingError(
            f"{CONTENT_ENCODING} {', '.join(unknown)} is not supported (gzip, deflate or identity)",
            field=CONTENT_ENCODING,
        )
    try:
        raw = await request.read()
    except web.RequestPayloadError as exc:  # a broken chunked body, or (aiohttp decoding) a bad stream
        field = CONTENT_ENCODING if codings else "body"
        raise BadRequestError(f"the request body could not be read: {exc}", field=field) from exc
    if codings and not decode:
        # Refused only once read: where aiohttp decodes (an app without BODY_HANDLER_ARGS), a
        # body left unread is decoded as the connection drains, and a bad one resets it.
        raise UnsupportedEncodingError(
            f"{CONTENT_ENCODING} {', '.join(codings)} is not accepted here: the body is forwarded as it came, "
            "and the workers take identity bodies",
            field=CONTENT_ENCODING,
        )
    limit = request.client_max_size
    for coding in reversed(codings):  # the last coding applied is the first undone (RFC 9110 §8.4)
        raw = _decode(raw, coding, limit)
    return raw


async def read_json_object(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object (`{}` when absent and `allow_empty`), or a 4xx naming `body`."""
    raw = await read_body(request)
    if not raw:  # absent; whitespace alone is not JSON and is refused below
        if allow_empty:
            return {}
        raise BadRequestError("request body must be a JSON object", field="body")
    data = parse_json(raw)
    if not isinstance(data, dict):  # `null` too: an absent body is no body, not JSON null
        raise BadRequestError("request body must be a JSON object", field="body")
    return data


def parse_json(raw: bytes) -> Any:
    """Strict JSON (RFC 8259: UTF-8, no NaN or Infinity), at most `MAX_DEPTH` deep, else a 400
    naming `body`; with no lone surrogate in any string, else a 422 naming where it is."""
    try:
        text = raw.decode("utf-8")  # json.loads(bytes) would also take UTF-16 and UTF-32
    except UnicodeDecodeError as exc:
        raise BadRequestError(f"request body is not UTF-8: {exc}", field="body") from exc
    if _might_nest_deeper(raw):
        _check_depth(text)
    try:
        if text.startswith("\ufeff"):  # as `json.loads` says it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        data = _DECODER.decode(text)
    except RecursionError as exc:  # unreachable after the depth check; kept as the last guard
        raise BadRequestError(f"request body is nested deeper than {MAX_DEPTH} levels", field="body") from exc
    except ValueError as exc:  # JSONDecodeError, NaN, an integer past Python's digit limit
        raise BadRequestError(f"request body is not valid JSON: {exc}", field="body") from exc
    if _SURROGATE_ESCAPE.search(raw) and (where := _lone_surrogate(data)) is not None:
        # A 422 naming the field, as a model would for a bad value there: JSON allows the escape,
        # but no text holds it, and a log line or a header that meets one raises.
        raise ValidationFailedError(
            f"{where}: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff): not valid Unicode", field=where
        )
    return data


def _codings(header: str) -> list[str]:
    if not header:
        return []
    return [c for c in (part.strip().lower() for part in header.split(",")) if c not in _IDENTITY]


def _decode(raw: bytes, coding: str, limit: int) -> bytes:
    if not raw:
        raise BadRequestError(f"an empty body cannot be {coding}-encoded", field=CONTENT_ENCODING)
    if coding == "deflate":
        # RFC 9110's deflate is zlib-wrapped; some clients send a raw deflate stream (aiohttp takes both).
        wbits = zlib.MAX_WBITS if raw[0] & 0x0F == 8 else -zlib.MAX_WBITS
    else:
        wbits = 16 + zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits=wbits)
    try:
        out = decoder.decompress(raw, limit + 1)  # bounded: a small bomb never expands past the limit
    except zlib.error as exc:
        raise BadRequestError(
            f"the body is not {coding} as its {CONTENT_ENCODING} says: {exc}", field=CONTENT_ENCODING
        ) from exc
    if len(out) > limit:
        raise PayloadTooLargeError(f"request body is larger than {limit} bytes once decoded", field="body")
    if not decoder.eof:
        raise BadRequestError(f"the {coding} stream ends early (truncated)", field=CONTENT_ENCODING)
    if decoder.unused_data:
        raise BadRequestError(
            f"{len(decoder.unused_data)} bytes follow the end of the {coding} stream", field=CONTENT_ENCODING
        )
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Made once: `json.loads` with an argument builds a decoder per call (~1% of the gateway's CPU).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _might_nest_deeper(raw: bytes) -> bool:
    # A count of openers bounds the depth from above: most bodies (a token list, a flat object)
    # skip the scan below this way at the cost of two C-speed counts.
    return raw.count(b"[") + raw.count(b"{") > MAX_DEPTH


_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_depth(text: str) -> None:
    """Refuse nesting past `MAX_DEPTH` before any recursive decoder sees it; strings are
    skipped whole, so brackets inside them do not count."""
    depth = 0
    for match in _STRUCTURE.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise BadRequestError(f"request body is nested deeper than {MAX_DEPTH} levels", field="body")
        elif token in "]}":
            depth -= 1


def _lone_surrogate(data: Any) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate ("body" at the
    top), or None."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return where or "body"
        elif isinstance(item, dict):
            for key, value in item.items():
                here = f"{where}.{key}" if where else str(key)
                stack.append((value, here))
                stack.append((key, where))  # popped first: a bad key is named by where it sits
        elif isinstance(item, list):
            stack.extend((value, f"{where}.{i}" if where else str(i)) for i, value in enumerate(item))
    return None
